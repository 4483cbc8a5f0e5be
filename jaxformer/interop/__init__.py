"""Weight import and export for other frameworks: `jaxformer.interop.torch` (PyTorch)."""
