"""Zeroed outputs only for programs that accumulate into them: a kernel that stores each element once (split-K
reduced inside a cluster) runs over a poisoned output, with no zeroing launch in its timed region."""
from pathlib import Path

import numpy as np

from cake_core.ir.text import parse_program
from cake_core.ir.zeroing import accumulated_params
from cake_core.lower import lower
from cake_core.problems import get_problem
from cake_core.runtime import cpu
from cake_core.problems import corpus_file

TINY = get_problem("tinygemm")


def _prog(name: str):
    return parse_program(corpus_file(name).read_text(), name)


def test_atomics_and_reads_count_as_accumulation_plain_stores_do_not():
    assert accumulated_params(_prog("tinygemm_splitk.cake")) == ("a", "b", "c")      # atomic_add into c
    assert accumulated_params(_prog("tinygemm_cluster.cake")) == ("a", "b")          # acc_cluster_reduce
    kmeans = get_problem("kmeans_update")
    assert set(kmeans.zeroed_for(accumulated_params(parse_program(kmeans.seed_text())))) == set(kmeans.outputs)


def test_zeroed_for_keeps_the_declared_outputs_when_the_program_is_unknown():
    assert TINY.zeroed_for(None) == ("c",)
    assert TINY.zeroed_for(("a", "b", "c")) == ("c",)
    assert TINY.zeroed_for(("a", "b")) == ()


def test_the_cpu_check_poisons_an_output_the_program_only_stores():
    shape = {"M": 3, "N": 40, "K": 152}
    assert np.isnan(cpu._poisoned(TINY, _prog("tinygemm_cluster.cake"), shape)["c"]).all()
    assert not cpu._poisoned(TINY, _prog("tinygemm_splitk.cake"), shape)["c"].any()


def test_the_lowered_kernel_carries_what_it_accumulates_into():
    assert lower(_prog("tinygemm_cluster.cake"), "x.cake").value.accumulates == ("a", "b")
    assert lower(_prog("tinygemm_splitk.cake"), "x.cake").value.accumulates == ("a", "b", "c")
