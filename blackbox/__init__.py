"""torch-blackbox: a flight recorder for PyTorch distributed training.
Importing this package is cheap and stdlib-only: it exposes the rank-side API and nothing else."""

from .api import annotate, log_metrics, phase, step

__version__ = "0.1.0"
__all__ = ["__version__", "annotate", "log_metrics", "phase", "step"]
