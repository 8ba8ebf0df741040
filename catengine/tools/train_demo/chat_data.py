"""The synthetic chat set: questions about the corpus's functions, classes and modules answered from their own
docstrings and source, rendered in the demo's chat template (ChatML, an empty think block before the answer, as
catengine.chat_template renders a final assistant turn without reasoning).

Kinds: "what does `json.dumps` do?" -> signature + docstring paragraph; "write a function that <summary>" -> the
function's source; "what is the `json` module for?" -> the module docstring; a few fixed turns about the model.
"""
from __future__ import annotations

import ast
import random
import textwrap

from .corpus import SourceFile

MAX_ANSWER_CHARS = 900
MAX_CODE_LINES = 40

WHAT = ("What does `{q}` do?", "Explain `{q}`.", "What is `{q}` used for?", "How do I use `{q}`?",
        "Tell me about `{q}`.", "what does {q} do", "Describe `{q}` from the `{m}` module.")
WRITE = ("Write a Python function that {s}", "Write a function that {s}", "Implement a function that {s}",
         "Can you write Python code that {s}")
MODULE = ("What is the `{m}` module for?", "What does the {m} module do?", "Explain the `{m}` module.")
ABOUT = [
    ("Hello!", "Hello! I am catengine's demo model, a small Qwen3.5-architecture model trained on Python's standard "
               "library and the sources of installed packages. Ask me what a Python function does, or ask me to "
               "write a small function."),
    ("Who are you?", "I am a small demo model served by catengine. I was trained for a few minutes on Python source "
                     "code and documentation, so I know some Python and little else."),
    ("What can you do?", "I can explain what functions and modules of the Python standard library do, and write "
                         "small Python functions. I am tiny, so my answers are often wrong."),
]


def render(question: str, answer: str) -> str:
    """One user question and the assistant's answer, exactly as CHAT_TEMPLATE renders the conversation."""
    return (f"<|im_start|>user\n{question}<|im_end|>\n"
            f"<|im_start|>assistant\n<think>\n\n</think>\n\n{answer}<|im_end|>\n")


def _paragraph(doc: str) -> str:
    para = doc.strip().split("\n\n")[0]
    para = " ".join(line.strip() for line in para.splitlines())
    return para[:MAX_ANSWER_CHARS]


def _summary(doc: str) -> str | None:
    first = doc.strip().splitlines()[0].strip().rstrip(".")
    if len(first) < 12 or not first[0].isalpha() or first.endswith(":"):
        return None
    return first[0].lower() + first[1:] + "."


def _signature(node) -> str:
    try:
        args = ast.unparse(node.args)
    except Exception:  # noqa: BLE001 - exotic syntax from another Python version: no signature, no sample
        return "(...)"
    return f"({args})"


def samples_from_file(f: SourceFile, rng: random.Random) -> list[str]:
    if not f.is_python:
        return []
    try:
        tree = ast.parse(f.text)
    except (SyntaxError, ValueError):
        return []
    mod, out = f.module, []
    lines = f.text.splitlines()
    mdoc = ast.get_docstring(tree)
    if mdoc and len(mdoc) > 40 and not mod.split(".")[-1].startswith("_"):
        out.append(render(rng.choice(MODULE).format(m=mod), _paragraph(mdoc)))
    for node in tree.body:
        items = [(node, node.name)] if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) else []
        if isinstance(node, ast.ClassDef):
            items += [(n, f"{node.name}.{n.name}") for n in node.body
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for n, qual in items:
            if any(part.startswith("_") for part in qual.split(".")):
                continue
            doc = ast.get_docstring(n)
            if not doc or len(doc) < 20:
                continue
            full = f"{mod}.{qual}"
            sig = "" if isinstance(n, ast.ClassDef) else _signature(n)
            out.append(render(rng.choice(WHAT).format(q=full, m=mod), f"`{full}{sig}`: {_paragraph(doc)}"))
            summary = _summary(doc)
            n_lines = (n.end_lineno or n.lineno) - n.lineno + 1
            if summary and not isinstance(n, ast.ClassDef) and "." not in qual and n_lines <= MAX_CODE_LINES \
                    and not n.decorator_list:
                code = textwrap.dedent("\n".join(lines[n.lineno - 1:n.end_lineno]))
                out.append(render(rng.choice(WRITE).format(s=summary), f"```python\n{code}\n```"))
    return out


def _file_samples(args) -> list[str]:
    f, seed = args
    return samples_from_file(f, random.Random(f"chat:{seed}:{f.root}:{f.rel}"))


def build_chat(files: list[SourceFile], seed: int, workers: int = 1) -> tuple[list[str], list[str]]:
    """(train, held_out) conversations; a file's conversations go where the file goes. Each file has its own
    seeded generator, so the result does not depend on ``workers`` (parsing 100 MB of Python takes a core
    about a minute)."""
    jobs = [(f, seed) for f in files if f.is_python]
    if workers > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(workers) as pool:
            per_file = pool.map(_file_samples, jobs, chunksize=64)
    else:
        per_file = [_file_samples(j) for j in jobs]
    rng = random.Random(f"chat:{seed}")
    train, held = [], []
    for (f, _), samples in zip(jobs, per_file):
        (held if f.held_out else train).extend(samples)
    train += [render(q, a) for q, a in ABOUT] * 20
    rng.shuffle(train)
    rng.shuffle(held)
    return train, held
