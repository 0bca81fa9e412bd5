"""The networks: U-Net and ResNet generators, (multi-scale) PatchGAN discriminator, identity recognizer."""
