"""The benchmark's fixed batch (bench/make_eval_batch.py): deterministic, large and mixed enough,
every candidate where the manifest says, broken the way its kind says."""
import ast
import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "suite"))
import candidate_variants  # noqa: E402
import make_eval_batch  # noqa: E402

MARKERS = {"cuda": r"\bload_inline\s*\(", "cuda-rtc": r"^\s*import\s+kz_rtc", "triton": r"@\s*triton\.jit"}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    out = tmp_path_factory.mktemp("batch")
    rows = make_eval_batch.write_batch(out)
    return out, rows


def test_manifest_matches_what_was_returned_and_written(batch):
    out, rows = batch
    assert make_eval_batch.read_manifest(out) == rows
    files = sorted(str(p.relative_to(out)) for p in (out / "candidates").rglob("*.py"))
    assert files == sorted(r["path"] for r in rows)


def test_the_same_bytes_on_every_run(batch, tmp_path):
    out, _ = batch
    make_eval_batch.write_batch(tmp_path)
    for path in [*out.rglob("*.py"), out / "manifest.jsonl"]:
        assert (tmp_path / path.relative_to(out)).read_bytes() == path.read_bytes(), path


def test_at_least_32_candidates_over_three_formats_correct_and_broken(batch):
    _, rows = batch
    assert len(rows) >= 32
    assert len({r["id"] for r in rows}) == len(rows)
    for fmt in candidate_variants.FORMATS:
        expected = {r["expected"] for r in rows if r["format"] == fmt}
        assert "ok" in expected and {"incorrect", "compile_error", "runtime_error"} <= expected, (fmt, expected)


def test_each_row_names_its_task_reference_and_kind(batch):
    _, rows = batch
    references = {p.stem for p in (ROOT / "suite" / "kzbench").rglob("*.py")}
    for row in rows:
        assert row["task"] in references
        assert (ROOT / row["reference"]).is_file() and pathlib.Path(row["reference"]).stem == row["task"]
        assert row["expected"] == candidate_variants.EXPECTED[row["kind"]]
        assert row["path"] == f"candidates/{row['task']}/{row['format']}__{row['kind']}.py"
        assert not pathlib.Path(row["reference"]).is_absolute(), "no machine paths in the manifest"


def test_sources_are_their_format_and_broken_as_their_kind(batch):
    out, rows = batch
    for row in rows:
        source = (out / row["path"]).read_text()
        assert re.search(MARKERS[row["format"]], source, re.M), row["id"]
        if row["kind"] == "python_syntax":
            with pytest.raises(SyntaxError):
                ast.parse(source)
            continue
        ast.parse(source)
        assert ("class ModelNew" in source) == (row["kind"] != "no_model_new"), row["id"]
        assert ("kz_variant_undefined_symbol" in source) == (row["kind"] == "kernel_compile_error"), row["id"]


def test_every_kernel_source_is_unique(batch):
    """Salted with its id, so no harness gets a cached build for free."""
    out, rows = batch
    sources = [(out / r["path"]).read_text() for r in rows]
    assert len(set(sources)) == len(sources)
    assert all(r["id"] in s for r, s in zip(rows, sources))


def test_kernelbench_gets_a_mix_under_any_limit(batch):
    _, rows = batch
    cuda = [r["expected"] for r in rows if r["format"] == "cuda"]
    for limit in range(2, len(cuda) + 1):
        assert "ok" in cuda[:limit] and any(e != "ok" for e in cuda[:limit]), limit


def test_cuda_candidates_only_on_references_without_parameters(batch):
    """KernelBench's harness does not copy weights into ModelNew: elsewhere our correct examples
    would be wrong for it."""
    torch = pytest.importorskip("torch")
    _, rows = batch
    for task in {r["task"] for r in rows if r["format"] == "cuda"}:
        namespace = {}
        reference = next(r["reference"] for r in rows if r["task"] == task)
        exec(compile((ROOT / reference).read_text(), reference, "exec"), namespace)
        for name, value in namespace.get("cpu_sizes", {}).items():
            namespace[name] = value
        with torch.no_grad():
            model = namespace["Model"](*namespace["get_init_inputs"]())
        assert not list(model.parameters()) and not list(model.buffers()), task


def test_formats_subset_and_describe(tmp_path):
    rows = make_eval_batch.write_batch(tmp_path, formats=("triton",))
    assert rows and {r["format"] for r in rows} == {"triton"}
    assert json.loads((tmp_path / "manifest.jsonl").read_text().splitlines()[0])["format"] == "triton"
    text = make_eval_batch.describe(rows)
    assert "triton" in text and "cuda-rtc" not in text


def test_variants_refuse_unknown_kinds_and_sources_without_a_kernel():
    with pytest.raises(ValueError):
        candidate_variants.make_variant("class ModelNew: pass", "slightly_off")
    with pytest.raises(ValueError):
        candidate_variants.make_variant("class ModelNew: pass", "kernel_compile_error", "cuda")
