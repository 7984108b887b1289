"""Peers: flash-linear-attention's ``chunk_kda`` (the chunked prefill) and ``fused_recurrent_kda`` (token by
token), on the problem's inputs with the state as the initial state (q carries its scale: ``scale=1``)."""
from __future__ import annotations

from cake_core.problems.common.kda_peers import fla_prefill_peer

PEERS = {"fla.chunk_kda": fla_prefill_peer("chunk_kda"),
         "fla.fused_recurrent_kda": fla_prefill_peer("fused_recurrent_kda")}
