"""Peers: flash-linear-attention's ``chunk_kda`` and ``fused_recurrent_kda`` on the packed inputs as their varlen
path takes them (a batch of one, ``cu_seqlens`` as int64 offsets, one initial state per sequence; q carries its
scale: ``scale=1``)."""
from __future__ import annotations

from cake_core.problems.common.kda_peers import fla_prefill_peer

PEERS = {"fla.chunk_kda": fla_prefill_peer("chunk_kda", packed=True),
         "fla.fused_recurrent_kda": fla_prefill_peer("fused_recurrent_kda", packed=True)}
