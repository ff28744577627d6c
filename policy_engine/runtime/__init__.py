"""The runtime interpreter: carries out a Plan inside the training process."""
