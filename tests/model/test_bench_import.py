"""Landing bench result files: program texts matched to their ptxas report, bad files refused."""
from __future__ import annotations

import pytest
from bench_fixture import PROGRAMS, write_bench

from cake_core.model.bench_import import BenchFileError, read_bench_file, resolve_texts, warehouse_rows
from cake_core.problems import corpus_file


def fake_check(text: str):
    """Today's 'ptxas': the recorded report for ws_n256 and the seed; other registers and smem for ws."""
    for key, (kernel, regs, smem) in PROGRAMS.items():
        if f"def {kernel}(" in text:
            return {"registers": regs, "smem_bytes": smem} if kernel != "gemm_bf16_ws" else \
                {"registers": 1, "smem_bytes": 2}
    return "does not compile today"


def test_reads_our_measured_rows_only(tmp_path):
    bf = read_bench_file(write_bench(tmp_path / "b.json"))
    assert bf.gpu == "NVIDIA H200" and bf.run_id("gemm_bf16") == "bench-b-gemm_bf16"
    assert len(bf.measurements) == 3 * 4 and bf.skipped_rows == 3          # the wrong rows stay out
    assert {m.program_key for m in bf.measurements} == set(PROGRAMS)


def test_texts_are_taken_only_where_the_ptxas_report_matches(tmp_path):
    bf = read_bench_file(write_bench(tmp_path / "b.json"))
    resolve_texts(bf, fake_check)
    got = {k: (p.source, p.text is not None) for k, p in bf.programs.items()}
    assert got["gemm_bf16/best:gemm_bf16_ws_n256.cake"] == ("tree", True)
    assert got["gemm_bf16/seed:gemm_bf16.cake"] == ("tree", True)
    assert got["gemm_bf16/best:gemm_bf16_ws.cake"][1] is False
    assert "no version matches the recorded 90 regs, 99328 B smem (tree: 1 regs, 2 B smem)" in \
        bf.programs["gemm_bf16/best:gemm_bf16_ws.cake"].note
    assert "neither in git history nor in the working tree" in bf.programs["gemm_bf16/best:no_such_program.cake"].note
    rows = warehouse_rows(bf)
    assert [r["run_id"] for r in rows["runs"]] == ["bench-b-gemm_bf16"]
    assert len(rows["attempts"]) == 2 and len(rows["measurements"]) == 6
    assert {c["registers"] for c in rows["compiles"]} == {96, 154}            # the recorded report, not today's


@pytest.mark.parametrize("content,msg", [("{", "not a JSON bench result"), ('{"rows": []}', "no date, gpu, programs"),
                                         ('{"date": "yesterday", "gpu": "x", "programs": {}, "rows": []}',
                                          "is not 'YYYY-MM-DD HH:MM:SS UTC'")])
def test_a_bad_file_is_one_clear_error(tmp_path, content, msg):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(BenchFileError, match=msg):
        read_bench_file(p)
    with pytest.raises(BenchFileError, match="no such file"):
        read_bench_file(tmp_path / "missing.json")


def test_a_program_in_no_commit_is_read_from_the_text_the_result_file_holds(tmp_path):
    """A chain or an evolved best timed by `--program` lives in no commit: its text travels in the file. The
    text is still checked against the recorded ptxas report, as a text from git would be."""
    import json
    from pathlib import Path
    path = write_bench(tmp_path / "b.json")
    doc = json.loads(path.read_text())
    text = corpus_file("gemm_bf16_ws_n256.cake").read_text()
    doc["programs"]["gemm_bf16/best:no_such_program.cake"]["text"] = text.replace("def gemm_bf16_ws_n256(",
                                                                                  "def no_such_program(")
    doc["programs"]["gemm_bf16/best:no_such_program.cake"]["kernel"] = "no_such_program"
    path.write_text(json.dumps(doc))
    recorded = doc["programs"]["gemm_bf16/best:no_such_program.cake"]["resources"]
    bf = read_bench_file(path)
    resolve_texts(bf, lambda t: {"registers": recorded["registers"], "smem_bytes": recorded["smem_bytes"]}
                  if "def no_such_program(" in t else "other")
    p = bf.programs["gemm_bf16/best:no_such_program.cake"]
    assert p.source == "file" and "def no_such_program(" in p.text
    again = read_bench_file(path)
    resolve_texts(again, lambda t: {"registers": 7, "smem_bytes": 9})       # today's report differs: not taken
    assert again.programs["gemm_bf16/best:no_such_program.cake"].text is None
