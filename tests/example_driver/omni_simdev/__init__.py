"""omni-backends-simdev: an example out-of-tree driver for a simulated device (see README.md)."""
