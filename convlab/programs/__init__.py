"""Programs built on the launchers: the measuring harness, whole networks (the class project's, LeNet-5), streams."""
