"""The networks: U-Net generator, PatchGAN discriminator, identity recognizer."""
