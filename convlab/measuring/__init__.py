"""Measuring and profiling: the course's workloads, cl.bench, profile cards, SASS, traces, the roofline, torch at its best, result rows."""
