"""Builders and checkers that are not the serving runtime: the quantizer, random-weight and tiny checkpoints, the
demo model, the end-to-end benchmark (`catengine bench`) and its correctness sections. The runtime takes one thing
from here, the demo model's path, and only when ``Engine(model=None)`` asks for it (a lazy import in engine.py).
"""
