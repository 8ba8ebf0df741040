"""Training the demo model: a small Qwen3.5-architecture model (Gated DeltaNet and gated full attention 3:1) with
a jointly trained MTP head, on data every machine has offline (the Python standard library and the installed
packages' sources and docstrings, plus a synthetic chat set made from them).

Torch only (plus ``tokenizers`` and ``safetensors``), so it runs on the GPU machine without catengine's serving
dependencies: ``python -m catengine.tools.train_demo --out DIR``. Modules: ``corpus`` (files and the held-out
split), ``chat_data`` (the synthetic chat set), ``bpe`` (the tokenizer), ``gdn`` (chunked gated delta rule and its
recurrent twin), ``model`` (the torch modules, written in the published checkpoint layout), ``train`` (the loop).
"""
