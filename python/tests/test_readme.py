"""The README's Python example runs as written (from the repository's root, as the README says), and the
BERT example where PyTorch and transformers are installed; the README and docs/ link only to files that
exist."""

import importlib.util
import os
import re

import pytest

from conftest import REPO, run_python


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    found = re.search(r"<!-- python-example -->\s*```python\n(.*?)```", text, re.S)
    assert found, "README.md has no ```python block after <!-- python-example -->"
    return found.group(1)


def test_the_readme_example_has_five_lines_and_runs_as_written(tmp_path):
    code = readme_example()
    assert len(code.strip().splitlines()) == 5, code
    env = {k: v for k, v in os.environ.items() if k not in ("FUSOR_BIN_DIR", "FUSOR_SERVER")}
    env["FUSOR_CACHE_DIR"] = str(tmp_path)  # not the user's kernel cache
    # Then the result against softmax(q kᵀ / 8) v in NumPy (the chain's scale is 0.125).
    check = ("\ns = q.astype('f8') @ k.astype('f8').transpose(0, 2, 1) * 0.125\n"
             "p = np.exp(s - s.max(-1, keepdims=True))\n"
             "np.testing.assert_allclose(out, p / p.sum(-1, keepdims=True) @ v, rtol=1e-4, atol=1e-5)\n"
             "print('ok')\n")
    proc = run_python("-c", code + check, env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
                    reason="needs PyTorch and transformers")
def test_the_bert_example_swaps_attention_without_changing_the_outputs(service):
    env = dict(os.environ, FUSOR_SERVER=service.address)
    proc = run_python(str(REPO / "examples" / "python" / "bert_attention.py"), "--layers", "1", "--seq", "64",
                      "--budget", "2", "--repeats", "1", env=env, timeout=600)
    assert proc.returncode == 0 and "outputs match" in proc.stdout, proc.stdout + proc.stderr[-3000:]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
                    reason="needs PyTorch and transformers")
def test_the_readme_torch_compile_example_runs_as_written(service, tmp_path):
    text = (REPO / "README.md").read_text()
    found = re.search(r"<!-- torch-example -->\s*```python\n(.*?)```", text, re.S)
    assert found, "README.md has no ```python block after <!-- torch-example -->"
    env = dict(os.environ, FUSOR_SERVER=service.address, FUSOR_CACHE_DIR=str(tmp_path))
    proc = run_python("-c", found.group(1), env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "('fusor_attention', " in proc.stdout and "('fusor_ffn', " in proc.stdout, proc.stdout
    assert "'tuning'" not in proc.stdout, proc.stdout  # waited for, then compared


def test_the_readme_is_short_and_its_links_and_the_docs_links_resolve():
    readme = REPO / "README.md"
    assert len(readme.read_text().splitlines()) <= 250
    pages = [readme] + sorted((REPO / "docs").glob("*.md"))
    assert len(pages) > 5, pages
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"
