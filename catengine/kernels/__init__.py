"""Triton kernels and their torch twins (``reference``); call ops through ``catengine.kernels.ops``."""
