"""A command plugin whose import fails."""

raise ImportError("fake command plugin needs a package that is not installed")
