"""Workflows: multi-stage pipelines and non-Trainer commands built on the library. Nothing below imports this."""
