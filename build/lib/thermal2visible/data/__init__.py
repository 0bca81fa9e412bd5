"""Data stages: synthesize or ingest paired images, preprocess them into a cache, load it for training. Two modules
are the served model's too, so that a frame is read and normalised exactly as training's were: images.py (reading a
file or request image within a pixel budget) and preprocess.py (the normalisation and face crop)."""
