"""The paper's studies' machinery: configurations as DVC experiments through DVC's queue (queue.py) or as training
runs in scratch projects (scratch.py), and what both read back from a finished training run (runs.py)."""
