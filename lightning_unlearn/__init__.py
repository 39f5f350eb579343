"""lightning_unlearn: LLM unlearning research on PyTorch Lightning."""

__version__ = "0.1.0"
