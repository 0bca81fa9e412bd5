"""The generator architectures, one module each. A module here defines one nn.Module with a `kind` (the value of
model.generator that picks it), a `size_rule` (why an image size does not fit it, or None) and the constructor
`(in_channels, out_channels, image_size, ngf, norm, dropout, recompute)`; models/networks.py finds it by itself.
"""
