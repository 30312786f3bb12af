"""Helpers the model-loading commands share."""

from __future__ import annotations

import argparse

from localllm.backend import LoadConfig


def load_config(args: argparse.Namespace, n_ctx: int) -> LoadConfig:
    return LoadConfig(
        n_ctx=n_ctx,
        n_threads=args.threads,
        n_gpu_layers=args.ngl,
        flash_attn=args.flash_attn,
        type_k=args.kv_type,
        type_v=args.kv_type,
        n_batch=args.batch,
        n_ubatch=args.batch,
    )
