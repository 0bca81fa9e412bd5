"""The generator architectures, one module each: a subclass of models.generator.Generator with its `kind` (the value
of model.generator that picks it) and `size_rule`; models/networks.py finds it by itself.
"""
