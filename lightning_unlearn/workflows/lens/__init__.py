"""LENS workflows: re-scoring saved generations (more to move here from ``lightning_unlearn.lens``)."""
