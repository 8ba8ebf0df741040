"""The README opens with the two set-up commands, and CI runs the second one exactly as written."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_readme_opens_with_install_and_test_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    first_block = lines.index("```bash")
    assert all(not line.strip() or line.startswith("#") for line in lines[:first_block]), "commands must come first"
    serve, test = readme_commands()
    assert serve == "pip install -e . && catengine serve"
    assert test.startswith("pip install -e \".[test]\"") and "pytest" in test


def test_ci_runs_the_readme_test_command():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci_lines
