"""The checking core every exercise check and warm-up puzzle stands on: verdicts, checked launches, named mistakes."""
