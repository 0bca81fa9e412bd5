"""Pix2Pix training with Lightning: the module, PSNR early stopping, the Trainer built from params."""
