"""The paper's studies' machinery: configurations as DVC experiments through DVC's queue (queue.py) or as training
runs in scratch projects (scratch.py), what both read back from a finished training run (runs.py), and each study's
table and figures (reports.py)."""
