"""Data stages: synthesize or ingest paired images, preprocess them into a cache, load it for training."""
