"""CUDA sources of the reference megakernel (package data, compiled at run time by NVRTC)."""
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent

