"""The discriminator architectures, one module each: a subclass of models.discriminator.Discriminator with its `kind`
(the value of model.discriminator that picks it); models/networks.py finds it by itself."""
