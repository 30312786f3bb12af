"""The compute buffer, by replaying llama.cpp's worst-case graph through ggml's allocator.

llama.cpp sizes its compute buffer by reserving the worst-case graph
(src/llama-context.cpp ``sched_reserve`` / ``graph_reserve``: ``n_ubatch``
tokens over the full cache, then one token, then ``n_ubatch`` again; the buffer
is the largest of the three). The size is the peak of ggml's graph allocator
(ggml/src/ggml-alloc.c ``ggml_gallocr``): graph inputs first, then every node
in graph order, each freed when its last consumer has run, an element-wise op
reusing its only parent's memory in place, free blocks reused best-fit. The
peak depends on the order and on fragmentation, so no closed formula follows
it on every graph: this module rebuilds the graph (tensor shapes, sources,
views, in graph order) the way src/llama-graph.cpp and src/models/<arch>.cpp
build it, and runs the allocator over it.

Pure Python (no llama.cpp import); the graphs cover the architectures in
``BUILDERS``, others return None and the planner falls back to its estimate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localllm.engine_api.llama_rules import hadamard_sides

# ggml type -> (bytes per block, values per block) (ggml/src/ggml.c type_traits)
_TYPES = {"f32": (4, 1), "f16": (2, 1), "bf16": (2, 1), "i32": (4, 1), "i64": (8, 1),
          "q8_0": (34, 32), "q4_0": (18, 32), "q4_1": (20, 32), "q5_0": (22, 32), "q5_1": (24, 32), "iq4_nl": (18, 32)}
ALIGN = 32  # TENSOR_ALIGNMENT (ggml/src/ggml-impl.h): the CPU buffer type's alignment

# ggml-alloc.c ggml_op_can_inplace
_INPLACE = {"FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL", "DIV", "SQR", "SQRT",
            "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK", "CLAMP", "SOFT_MAX", "SOFT_MAX_BACK"}


def _row(type_: str, n: int) -> int:
    size, blck = _TYPES[type_]
    return n // blck * size


class Tensor:
    """A ggml tensor as the allocator sees it: shape, strides, op, sources, view source."""

    __slots__ = ("ne", "nb", "type", "op", "src", "view_src", "input", "output", "ext")

    def __init__(self, type_: str, ne: tuple[int, ...], op: str = "NONE", src: tuple[Tensor | None, ...] = (),
                 view_src: Tensor | None = None, nb: tuple[int, ...] | None = None, ext: bool = False) -> None:
        ne = tuple(ne) + (1,) * (4 - len(ne))
        self.ne, self.type, self.op, self.src, self.view_src, self.ext = ne, type_, op, src, view_src, ext
        if nb is None:
            size, blck = _TYPES[type_]
            n0 = size
            n1 = _row(type_, ne[0])
            nb = (n0, n1, n1 * ne[1], n1 * ne[1] * ne[2])
        self.nb = nb
        self.input = False
        self.output = False

    def nbytes(self) -> int:
        return _row(self.type, self.ne[0]) * self.ne[1] * self.ne[2] * self.ne[3]

    def nelements(self) -> int:
        return self.ne[0] * self.ne[1] * self.ne[2] * self.ne[3]

    def contiguous(self) -> bool:
        return self.nb == Tensor(self.type, self.ne).nb


# -- ggml ops (ggml/src/ggml.c): the result's type and shape, and whether it is a view --------


def new(type_: str, *ne: int, input: bool = True) -> Tensor:
    t = Tensor(type_, ne)
    t.input = input
    return t


def weight(*ne: int, type_: str = "f16") -> Tensor:
    return Tensor(type_, ne, ext=True)


def op(name: str, type_: str, ne: tuple[int, ...], *src: Tensor | None) -> Tensor:
    return Tensor(type_, ne, name, tuple(s for s in src))


def dup(name: str, a: Tensor, *src: Tensor | None) -> Tensor:
    """ggml_dup_tensor(a): a new tensor of a's type and shape (element-wise ops, norms, rope, soft_max)."""
    return Tensor(a.type, a.ne, name, (a,) + tuple(src))


def view(a: Tensor, ne: tuple[int, ...], nb: tuple[int, ...] | None = None, name: str = "VIEW") -> Tensor:
    """ggml_view_Nd / ggml_reshape_Nd: no memory of its own; ``nb`` gives strides 1.. (the rest follow)."""
    ne = tuple(ne) + (1,) * (4 - len(ne))
    full = list(Tensor(a.type, ne).nb)
    for i, b in enumerate(nb or ()):
        full[i + 1] = b
        for j in range(i + 2, 4):
            full[j] = full[j - 1] * ne[j - 1]
    return Tensor(a.type, ne, name, (a,), view_src=a.view_src or a, nb=tuple(full))


def reshape(a: Tensor, *ne: int) -> Tensor:
    return view(a, ne, name="RESHAPE")


def permute(a: Tensor, *axes: int) -> Tensor:
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    return Tensor(a.type, tuple(ne), "PERMUTE", (a,), view_src=a.view_src or a, nb=tuple(nb))


def transpose(a: Tensor) -> Tensor:
    return permute(a, 1, 0, 2, 3)


def cont(a: Tensor, *ne: int) -> Tensor:
    return Tensor(a.type, ne or a.ne, "CONT", (a,))


def mul_mat(w: Tensor, x: Tensor) -> Tensor:
    return op("MUL_MAT", "f32", (w.ne[1], x.ne[1], x.ne[2], x.ne[3]), w, x)


def get_rows(a: Tensor, ids: Tensor) -> Tensor:
    return op("GET_ROWS", "f32", (a.ne[0], ids.ne[0], ids.ne[1], ids.ne[2]), a, ids)


def set_rows(dst: Tensor, a: Tensor, ids: Tensor) -> Tensor:
    """ggml_set_rows returns a view of ``dst``: no memory of its own."""
    return Tensor(dst.type, dst.ne, "SET_ROWS", (a, ids, dst), view_src=dst.view_src or dst, nb=dst.nb)


def norm(a: Tensor, w: Tensor | None, b: Tensor | None = None, kind: str = "RMS_NORM") -> Tensor:
    """llm_graph_context::build_norm (src/llama-graph.cpp)."""
    cur = dup(kind, a)
    if w is not None:
        cur = dup("MUL", cur, w)
    if b is not None:
        cur = dup("ADD", cur, b)
    return cur


def rope(a: Tensor, pos: Tensor, factors: Tensor | None = None) -> Tensor:
    return dup("ROPE", a, pos, factors) if factors is not None else dup("ROPE", a, pos)


class Graph:
    """ggml_cgraph: nodes and leafs in ggml_visit_parents order (sources left to right)."""

    def __init__(self) -> None:
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self._seen: set[int] = set()

    def expand(self, t: Tensor) -> None:
        stack: list[tuple[Tensor, int]] = [(t, 0)]
        while stack:
            node, i = stack.pop()
            if i == 0:
                if id(node) in self._seen:
                    continue
                self._seen.add(id(node))
            if i < len(node.src):
                stack.append((node, i + 1))
                s = node.src[i]
                if s is not None and id(s) not in self._seen:
                    stack.append((s, 0))
                continue
            (self.leafs if node.op == "NONE" else self.nodes).append(node)


def _pad(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _DynAlloc:
    """ggml_dyn_tallocr with one chunk (the CPU buffer type has no size limit):
    free blocks sorted by offset, the last one unbounded; best fit among the others."""

    def __init__(self) -> None:
        self.blocks: list[list[int]] = [[0, 1 << 62]]
        self.max_size = 0

    def alloc(self, size: int) -> int:
        size = _pad(size)
        best, best_size = -1, None
        for i, (_, bsize) in enumerate(self.blocks[:-1]):
            if bsize >= size and (best_size is None or bsize <= best_size):
                best, best_size = i, bsize
        if best < 0:
            best = len(self.blocks) - 1
        block = self.blocks[best]
        addr = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.blocks[best]
        self.max_size = max(self.max_size, addr + size)
        return addr

    def free(self, addr: int, size: int) -> None:
        size = _pad(size)
        blocks = self.blocks
        for i, block in enumerate(blocks):
            if block[0] + block[1] == addr:
                block[1] += size
                if i < len(blocks) - 1 and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if addr + size == block[0]:
                block[0] = addr
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < addr:
            pos += 1
        blocks.insert(pos, [addr, size])


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


def allocate(graph: Graph) -> int:
    """Peak bytes of ggml_gallocr_alloc_graph_impl (ggml/src/ggml-alloc.c) over ``graph``."""
    alloc = _DynAlloc()
    n_children: dict[int, int] = {}
    n_views: dict[int, int] = {}
    own: dict[int, bool] = {}
    addr: dict[int, int] = {}

    def is_view(t: Tensor) -> bool:
        return t.view_src is not None

    def allocated(t: Tensor) -> bool:
        return t.ext or own.get(id(t), False)

    def allocate_node(t: Tensor) -> None:
        if allocated(t) or is_view(t) or id(t) in addr:
            return
        own[id(t)] = True
        if t.op in _INPLACE:
            for p in t.src:
                # a view is never the allocator's own tensor, so only a plain parent is reused
                if p is None or not own.get(id(p), False) or p.output or not _same_layout(t, p):
                    continue
                if n_children.get(id(p), 0) == 1 and n_views.get(id(p), 0) == 0:
                    addr[id(t)] = addr[id(p)]
                    own[id(p)] = False
                    _free_extra(alloc, addr[id(p)], p, t)
                    return
        addr[id(t)] = alloc.alloc(t.nbytes())

    def free_node(t: Tensor) -> None:
        if t.output:
            return
        alloc.free(addr[id(t)], t.nbytes())
        own[id(t)] = False

    for leaf in graph.leafs:
        allocate_node(leaf)
    for node in graph.nodes:
        if is_view(node):
            n_views[id(node.view_src)] = n_views.get(id(node.view_src), 0) + 1
        if node.input:
            allocate_node(node)
        for s in node.src:
            if s is None:
                continue
            n_children[id(s)] = n_children.get(id(s), 0) + 1
            if s.input:
                allocate_node(s)
    for node in graph.nodes:
        for p in node.src:
            if p is not None:
                allocate_node(p)
        allocate_node(node)
        for p in node.src:
            if p is None:
                continue
            n_children[id(p)] -= 1
            if n_children[id(p)] == 0 and n_views.get(id(p), 0) == 0:
                if is_view(p):
                    vs = p.view_src
                    assert vs is not None  # is_view: a view always has its source
                    n_views[id(vs)] -= 1
                    if n_views[id(vs)] == 0 and n_children.get(id(vs), 0) == 0 and own.get(id(vs)):
                        free_node(vs)
                elif own.get(id(p)):
                    free_node(p)
    return alloc.max_size


def _free_extra(alloc: _DynAlloc, base: int, parent: Tensor, node: Tensor) -> None:
    """ggml_gallocr_free_extra_space: an in-place result smaller than its parent frees the tail."""
    ps, ns = _pad(parent.nbytes()), _pad(node.nbytes())
    if ps > ns:
        alloc.free(base + ns, ps - ns)


# -- the graph llama.cpp reserves ------------------------------------------------------------------


class Ctx:
    """What llm_graph_context knows while building: the ubatch, the cache views, the inputs."""

    def __init__(self, p: dict[str, Any], n_tokens: int, n_outputs: int) -> None:
        self.p = p
        self.T = n_tokens
        self.n_outputs = n_outputs
        self.gf = Graph()
        self.fa = p["flash_attn"]

    # src/llama-graph.cpp build_inp_embd
    def inp_embd(self) -> Tensor:
        E, T = self.p["n_embd"], self.T
        tokens = new("i32", T)
        embd = new("f32", E, T)
        cur = get_rows(weight(E, self.p["n_vocab"]), tokens)
        self.gf.expand(cur)
        self.gf.expand(embd)  # ggml_build_forward_select keeps both inputs in the graph
        return cur

    def inp_pos(self) -> Tensor:
        return new("i32", self.T)

    # src/llama-graph.cpp build_attn_inp_kv(_iswa) and src/llama-kv-cache.cpp build_input_*
    def attn_inputs(self, cache: dict[str, Any]) -> dict[str, Any]:
        T = self.T
        inp: dict[str, Any] = {"k_idxs": new("i64", T)}
        inp["v_idxs"] = new("i64", T) if self.fa else new("i64", T * cache["n_embd_v_max"])
        if cache["has_v"] is False:
            inp["v_idxs"] = None
        inp["mask"] = new("f16" if self.fa else "f32", cache["n_kv"], T)
        inp["k_rot"] = new("f32", cache["k_rot"], cache["k_rot"]) if cache["k_rot"] else None
        inp["v_rot"] = new("f32", 64, 64) if cache["v_rot"] else None
        inp["cache"] = cache
        return inp

    def out_ids(self) -> Tensor:
        return new("i32", self.n_outputs)

    # src/llama-graph.cpp build_attn (llm_graph_input_attn_kv and _kv_iswa)
    def attn(self, inp: dict[str, Any], il: int, q: Tensor, k: Tensor, v: Tensor | None, wo: Tensor | None,
             iswa: bool, v_mla: Tensor | None = None) -> Tensor:
        c = inp["cache"]
        if inp["k_rot"] is not None:
            q = _hadamard(q, inp["k_rot"])
            k = _hadamard(k, inp["k_rot"])
        if inp["v_rot"] is not None and v is not None:
            v = _hadamard(v, inp["v_rot"])
        order = (q, k, v) if iswa else (q, v, k)
        for t in order:
            if t is not None:
                self.gf.expand(t)
        kt, vt = c["type_k"], c["type_v"]
        hk, hv, nkv, n_kv = c["head_k"][il], c["head_v"][il], c["n_head_kv"][il], c["n_kv"]
        k_cache = Tensor(kt, (hk * nkv, n_kv), ext=True)
        self.gf.expand(set_rows(k_cache, view(k, (hk * nkv, self.T), (k.nb[2],)), inp["k_idxs"]))
        if v is not None:
            v_cache = Tensor(vt, (c["n_embd_v_max"] if not self.fa else hv * nkv, n_kv), ext=True)
            if self.fa:
                vc = view(v, (hv * nkv, self.T), (v.nb[2],))
                self.gf.expand(set_rows(v_cache, vc, inp["v_idxs"]))
            else:
                vc = reshape(v, hv * nkv, self.T) if v.contiguous() else cont(v, hv * nkv, self.T)
                if hv * nkv < c["n_embd_v_max"]:
                    vc = op("PAD", vc.type, (c["n_embd_v_max"], self.T), vc)
                vview = reshape(v_cache, 1, v_cache.nelements())
                vc = reshape(vc, 1, vc.nelements())
                self.gf.expand(set_rows(vview, vc, inp["v_idxs"]))
        else:
            v_cache = k_cache
        # llama_kv_cache::get_k / get_v: views of the cache
        kv = Tensor(kt, (hk, nkv, n_kv, 1), "VIEW", (k_cache,), view_src=k_cache,
                    nb=(_TYPES[kt][0], _row(kt, hk), _row(kt, hk * nkv), _row(kt, hk * nkv * n_kv)))
        if v is None:  # MLA: V is a view of the K cache (the latent)
            vv = Tensor(kt, (hv, nkv, n_kv, 1), "VIEW", (k_cache,), view_src=k_cache,
                        nb=(_TYPES[kt][0], _row(kt, hk), _row(kt, hk * nkv), _row(kt, hk * nkv * n_kv)))
        elif self.fa:
            vv = Tensor(vt, (hv, nkv, n_kv, 1), "VIEW", (v_cache,), view_src=v_cache,
                        nb=(_TYPES[vt][0], _row(vt, hv), _row(vt, c["n_embd_v_max"] if not self.fa else hv * nkv), _row(vt, hv * nkv * n_kv)))
        else:
            vv = Tensor(vt, (n_kv, nkv, hv, 1), "VIEW", (v_cache,), view_src=v_cache,
                        nb=(_TYPES[vt][0], _row(vt, n_kv * hv), _row(vt, n_kv), _row(vt, n_kv * c["n_embd_v_max"])))
        cur = self.mha(q, kv, vv, inp["mask"], v_mla)
        if inp["v_rot"] is not None and v is not None:
            cur = _hadamard(cur, inp["v_rot"])
        if wo is not None:
            cur = mul_mat(wo, cur)
        return cur

    # src/llama-graph.cpp build_attn_mha
    def mha(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, v_mla: Tensor | None) -> Tensor:
        v_trans = v.nb[1] > v.nb[2]
        q = view(q, q.ne, q.nb[1:])
        q = permute(q, 0, 2, 1, 3)
        k = permute(k, 0, 2, 1, 3)
        v = permute(v, 0, 2, 1, 3)
        if self.fa:
            if v_trans:
                v = transpose(v)
            cur = op("FLASH_ATTN_EXT", "f32", (v.ne[0], q.ne[2], q.ne[1], q.ne[3]), q, k, v, mask)
            if v_mla is not None:
                cur = permute(cur, 0, 2, 1, 3)
                cur = mul_mat(v_mla, cur)
                cur = permute(cur, 0, 2, 1, 3)
                cur = cont(cur)
            cur = reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = mul_mat(k, q)
            if self.p.get("attn_softcap"):
                kq = dup("SCALE", kq)
                kq = dup("UNARY", kq)
                kq = dup("SCALE", kq)
            kq = dup("SOFT_MAX", kq, mask)
            if not v_trans:
                v = cont(transpose(v))
            kqv = mul_mat(v, kq)
            if v_mla is not None:
                kqv = mul_mat(v_mla, kqv)
            cur = permute(kqv, 0, 2, 1, 3)
            cur = cont(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        self.gf.expand(cur)
        return cur

    # src/llama-graph.cpp build_ffn with a parallel gate (SwiGLU / GeGLU): up, gate, glu, down
    def ffn(self, cur: Tensor, n_ff: int) -> Tensor:
        E = self.p["n_embd"]
        up = mul_mat(weight(E, n_ff), cur)
        gate = mul_mat(weight(E, n_ff), cur)
        x = op("GLU", "f32", gate.ne, gate, up)
        return mul_mat(weight(n_ff, E), x)


def _moe_ffn(c: Ctx, cur: Tensor) -> Tensor:
    """llm_graph_context::build_moe_ffn (src/llama-graph.cpp) with softmax gating,
    normalized weights, a gate and SiLU (qwen3moe): the router, the top-k
    experts (ggml_argsort_top_k), gate/up/down over the used experts
    (ggml_mul_mat_id) and the weighted sum of their outputs."""
    p = c.p
    E, T, X, k, F = p["n_embd"], cur.ne[1], p["n_expert"], p["n_expert_used"], p["n_ff_exp"]
    logits = mul_mat(_w(E, X), cur)
    probs = dup("SOFT_MAX", logits)
    order = op("ARGSORT", "i32", probs.ne, probs)
    selected = view(order, (k, T), (order.nb[1],))
    weights = get_rows(reshape(probs, 1, X, T), selected)
    weights = reshape(weights, k, T)
    wsum = dup("CLAMP", op("SUM_ROWS", "f32", (1, T), weights))
    weights = reshape(dup("DIV", weights, wsum), 1, k, T)
    c.gf.expand(weights)
    x = reshape(cur, E, 1, T)
    up = op("MUL_MAT_ID", "f32", (F, k, T), weight(E, F, X), x, selected)
    gate = op("MUL_MAT_ID", "f32", (F, k, T), weight(E, F, X), x, selected)
    h = op("GLU", "f32", gate.ne, gate, up)
    experts = op("MUL_MAT_ID", "f32", (E, k, T), weight(F, E, X), h, selected)
    experts = dup("MUL", experts, weights)
    c.gf.expand(experts)
    views = [view(experts, (E, T), (experts.nb[2],)) for _ in range(k)]
    for v in views:
        c.gf.expand(v)
    out = views[0]
    for v in views[1:]:
        out = dup("ADD", out, v)
        c.gf.expand(out)
    return out if k > 1 else cont(out)


def _hadamard(cur: Tensor, rot: Tensor) -> Tensor:
    """llama_mul_mat_hadamard (src/llama-impl.h)."""
    n = rot.ne[0]
    res = reshape(cur, n, cur.nelements() // n) if cur.contiguous() else cont(cur, n, cur.nelements() // n)
    res = mul_mat(rot, res)
    return reshape(res, *cur.ne)


def _w(*ne: int) -> Tensor:
    return weight(*ne)


def _decoder(c: Ctx, arch: str) -> Tensor | None:
    """The dense decoder families (src/models/llama.cpp, qwen2.cpp, qwen3.cpp, granite.cpp,
    gemma2.cpp, gemma3.cpp, olmo2.cpp, exaone4.cpp): per layer pre- or post-norm,
    Q/K/V (with Q/K norms where the model has them), rope, attention, FFN."""
    p = c.p
    if p["n_expert"] and arch != "qwen3moe":
        return None  # a mixture-of-experts FFN in these files (e.g. Mixtral as "llama") is not rebuilt
    E, H, T = p["n_embd"], p["n_head"], c.T
    hk = p["head_k"]
    iswa = p["iswa"]
    gemma = arch in ("gemma2", "gemma3")
    post_norm = arch in ("olmo2", "exaone4")  # no pre-norms: norms after attention and FFN
    cur = c.inp_embd()
    if gemma:
        cur = dup("SCALE", cur)  # inpL * sqrt(n_embd)
    elif arch == "granite":
        cur = dup("SCALE", cur)  # f_embedding_scale where the model sets it (in place: no memory either way)
    inpL = cur
    pos = c.inp_pos()
    caches = p["caches"]
    inputs = {name: c.attn_inputs(cache) for name, cache in caches.items()}
    out_ids = c.out_ids()
    layers = p["layers"]
    for il in layers:
        swa = il in p["swa_layers"]
        inp = inputs["swa" if (iswa and swa) else "base"]
        nkv = p["n_head_kv"][il]
        inpSA = inpL
        x = inpL if post_norm else norm(inpL, _w(E))
        wo = _w(H * hk, E)
        if arch == "phi3":
            # one fused QKV matrix: Q, K and V are views of its output (build_qkv, wqkv)
            qkv = mul_mat(_w(E, H * hk + 2 * nkv * hk), x)
            q = view(qkv, (hk, H, T), (_row("f32", hk), qkv.nb[1]))
            k = view(qkv, (hk, nkv, T), (_row("f32", hk), qkv.nb[1]))
            v = view(qkv, (hk, nkv, T), (_row("f32", hk), qkv.nb[1]))
            q, k = rope(q, pos), rope(k, pos)
            q = dup("SCALE", q)
        elif arch == "olmo2":
            # build_qkv(..., reshape=false): 2-D Q/K/V, the norms over the whole row
            q = mul_mat(_w(E, H * hk), x)
            k = mul_mat(_w(E, nkv * hk), x)
            v = mul_mat(_w(E, nkv * hk), x)
            q = norm(q, _w(H * hk))
            k = norm(k, _w(nkv * hk))
            q = reshape(q, hk, H, T)
            k = reshape(k, hk, nkv, T)
            v = reshape(v, hk, nkv, T)
            q, k = rope(q, pos), rope(k, pos)
        else:
            q = mul_mat(_w(E, H * hk), x)
            if arch == "qwen2":
                q = dup("ADD", q, _w(H * hk))
            k = mul_mat(_w(E, nkv * hk), x)
            if arch == "qwen2":
                k = dup("ADD", k, _w(nkv * hk))
            v = mul_mat(_w(E, nkv * hk), x)
            if arch == "qwen2":
                v = dup("ADD", v, _w(nkv * hk))
            q, k, v = reshape(q, hk, H, T), reshape(k, hk, nkv, T), reshape(v, hk, nkv, T)
            qk_norm = arch in ("qwen3", "qwen3moe", "gemma3", "exaone4")
            use_rope = arch != "exaone4" or swa or not iswa
            if qk_norm:
                q = norm(q, _w(hk))
            if use_rope:
                q = rope(q, pos)
            if qk_norm:
                k = norm(k, _w(hk))
            if use_rope:
                k = rope(k, pos)
            if gemma:
                q = dup("SCALE", q)
        cur = c.attn(inp, il, q, k, v, wo, iswa)
        if il == layers[-1]:
            cur = get_rows(cur, out_ids)
            inpSA = get_rows(inpSA, out_ids)
        if arch == "granite":
            cur = dup("SCALE", cur)  # build_layer_ffn: f_residual_scale (in place)
        if gemma or post_norm:
            cur = norm(cur, _w(E))
        ffn_inp = dup("ADD", cur, inpSA)
        x = ffn_inp if post_norm else norm(ffn_inp, _w(E))
        if arch == "phi3":
            # build_ffn with LLM_FFN_SWIGLU / LLM_FFN_SEQ: one up matrix of 2 n_ff, a fused SwiGLU
            up = mul_mat(_w(E, 2 * p["n_ff"][il]), x)
            cur = mul_mat(_w(p["n_ff"][il], E), op("GLU", "f32", (p["n_ff"][il],) + up.ne[1:], up))
        elif arch == "qwen3moe":
            cur = _moe_ffn(c, x)
        else:
            cur = c.ffn(x, p["n_ff"][il])
        if gemma or post_norm:
            cur = norm(cur, _w(E))
        cur = dup("ADD", ffn_inp, cur) if arch == "phi3" else dup("ADD", cur, ffn_inp)
        inpL = cur
    cur = norm(inpL, _w(E))
    cur.output = True  # res->t_embd (llm_graph_result::set_outputs)
    cur = mul_mat(_w(E, p["n_vocab"]), cur)
    if arch == "granite":
        cur = dup("SCALE", cur)
    if p.get("final_softcap"):
        cur = dup("SCALE", cur)
        cur = dup("UNARY", cur)
        cur = dup("SCALE", cur)
    cur.output = True  # res->t_logits
    return cur


def _lfm2(c: Ctx, arch: str) -> Tensor:
    """src/models/lfm2.cpp: a hybrid of short-convolution layers (a recurrent
    state, llm_graph_context::build_rs) and attention layers, dense FFN."""
    p = c.p
    E, H, T, hk = p["n_embd"], p["n_head"], c.T, p["head_k"]
    cur = c.inp_embd()
    c.gf.expand(cur)
    s_copy = new("i32", 1)  # build_rs_inp_impl: one recurrent state per sequence
    s_copy_main = view(s_copy, (1,))
    s_copy_extra = view(s_copy, (0,))
    inputs = {name: c.attn_inputs(cache) for name, cache in p["caches"].items()}
    pos = c.inp_pos()
    out_ids = c.out_ids()
    layers = p["layers"]
    d_conv = p["l_cache"] - 1
    for il in layers:
        prev = cur
        cur = norm(cur, _w(E))
        if il in p["recurrent_layers"]:
            cur = reshape(cur, E, T, 1)
            bcx = mul_mat(_w(E, 3 * E), cur)
            b, cc, x = (view(bcx, (E, T, 1), nb=(bcx.nb[1], bcx.nb[2])) for _ in range(3))
            bx = transpose(dup("MUL", b, x))
            state = Tensor("f32", (d_conv * E, 1), ext=True)
            states = reshape(state, d_conv * E, 1)
            zero = view(states, (0,))
            c.gf.expand(Tensor("f32", zero.ne, "SCALE", (zero,), view_src=states.view_src, nb=zero.nb))
            out_states = get_rows(states, s_copy_main)
            c.gf.expand(out_states)
            extra = get_rows(states, s_copy_extra)
            dst = view(state, (d_conv * E, 0))
            c.gf.expand(Tensor("f32", dst.ne, "CPY", (extra, dst), view_src=state, nb=dst.nb))
            conv = reshape(out_states, d_conv, E, 1)
            bx = op("CONCAT", "f32", (d_conv + T, E, 1), conv, bx)
            snap = view(bx, (d_conv, E, 1), (bx.nb[1], bx.nb[2]))
            dst = view(state, (d_conv * E, 1))
            c.gf.expand(Tensor("f32", dst.ne, "CPY", (snap, dst), view_src=state, nb=dst.nb))
            conv_out = op("SSM_CONV", "f32", (E, T, 1), bx, _w(d_conv + 1, E))
            y = dup("MUL", cc, conv_out)
            y = mul_mat(_w(E, E), y)
            cur = reshape(y, E, T)
        else:
            inp = inputs["swa" if (p["iswa"] and il in p["swa_layers"]) else "base"]
            nkv = p["n_head_kv"][il]
            q = reshape(mul_mat(_w(E, H * hk), cur), hk, H, T)
            k = reshape(mul_mat(_w(E, nkv * hk), cur), hk, nkv, T)
            v = reshape(mul_mat(_w(E, nkv * hk), cur), hk, nkv, T)
            q = rope(norm(q, _w(hk)), pos)
            k = rope(norm(k, _w(hk)), pos)
            cur = c.attn(inp, il, q, k, v, _w(H * hk, E), p["iswa"])
        if il == layers[-1]:
            cur = get_rows(cur, out_ids)
            prev = get_rows(prev, out_ids)
        cur = dup("ADD", prev, cur)
        ffn_out = c.ffn(norm(cur, _w(E)), p["n_ff"][il])
        cur = dup("ADD", cur, ffn_out)
    cur = norm(cur, _w(E))
    cur.output = True
    cur = mul_mat(_w(E, p["n_vocab"]), cur)
    cur.output = True
    return cur


def _deepseek2(c: Ctx, arch: str) -> Tensor | None:
    """src/models/deepseek2.cpp with MLA (the cache holds the compressed latent and
    the rope part; Q absorbs wk_b, V is read from the latent and decompressed by
    wv_b: llm_graph_context::build_attn over llm_graph_input_attn_k) and dense
    layers. A layer past leading_dense_block_count is a mixture of experts,
    which is not rebuilt here (None: the planner estimates)."""
    p = c.p
    E, H, T = p["n_embd"], p["n_head"], c.T
    hk_mla, hv_mla, q_lora, n_dense = p["mla_dims"]
    r = p["head_v"]  # value_length: kv_lora_rank
    rope_d = p["head_k"] - r  # key_length - kv_lora_rank: the rope part
    nope = hk_mla - rope_d
    if not (p["mla"] and hk_mla and hv_mla and n_dense >= p["n_layer"]):
        return None
    cur = c.inp_embd()
    inpL = cur
    pos = c.inp_pos()
    cache = p["caches"]["base"]
    k_idxs = new("i64", T)
    mask = new("f16" if c.fa else "f32", cache["n_kv"], T)
    out_ids = c.out_ids()
    layers = p["layers"]
    kt = cache["type_k"]
    for il in layers:
        inpSA = inpL
        x = norm(inpL, _w(E))
        if q_lora:
            q = mul_mat(_w(q_lora, H * hk_mla), norm(mul_mat(_w(E, q_lora), x), _w(q_lora)))
        else:
            q = mul_mat(_w(E, H * hk_mla), x)
        q = reshape(q, hk_mla, H, T)
        kv_pe = mul_mat(_w(E, r + rope_d), x)
        kv_cmpr = view(kv_pe, (r, T), (kv_pe.nb[1],))
        k_pe = rope(view(kv_pe, (rope_d, 1, T), (kv_pe.nb[1], kv_pe.nb[1])), pos)
        kv_cmpr = norm(kv_cmpr, _w(r))
        q_nope = view(q, (nope, H, T), (q.nb[1], q.nb[2]))
        q_pe = rope(view(q, (rope_d, H, T), (q.nb[1], q.nb[2])), pos)
        q_nope = permute(q_nope, 0, 2, 1, 3)
        q_abs = permute(mul_mat(_w(nope, r, H), q_nope), 0, 2, 1, 3)
        qcur = op("CONCAT", "f32", (r + rope_d, H, T), q_abs, q_pe)
        kv_cmpr = reshape(kv_cmpr, r, 1, T)
        kcur = op("CONCAT", "f32", (r + rope_d, 1, T), kv_cmpr, k_pe)
        for t in (qcur, kv_cmpr, kcur):
            c.gf.expand(t)
        k_cache = Tensor(kt, ((r + rope_d), cache["n_kv"]), ext=True)
        c.gf.expand(set_rows(k_cache, view(kcur, (r + rope_d, T), (kcur.nb[2],)), k_idxs))
        kv = Tensor(kt, (r + rope_d, 1, cache["n_kv"], 1), "VIEW", (k_cache,), view_src=k_cache,
                    nb=(_TYPES[kt][0], _row(kt, r + rope_d), _row(kt, r + rope_d), _row(kt, (r + rope_d) * cache["n_kv"])))
        vv = Tensor(kt, (r, 1, cache["n_kv"], 1), "VIEW", (kv,), view_src=k_cache, nb=kv.nb)
        cur = c.mha(qcur, kv, vv, mask, _w(r, hv_mla, H))
        cur = mul_mat(_w(H * hv_mla, E), cur)
        if il == layers[-1]:
            cur = get_rows(cur, out_ids)
            inpSA = get_rows(inpSA, out_ids)
        ffn_inp = dup("ADD", cur, inpSA)
        cur = c.ffn(norm(ffn_inp, _w(E)), p["n_ff"][il])
        cur = dup("ADD", cur, ffn_inp)
        inpL = cur
    cur = norm(inpL, _w(E))
    cur.output = True
    cur = mul_mat(_w(E, p["n_vocab"]), cur)
    cur.output = True
    return cur


BUILDERS: dict[str, Callable[[Ctx, str], Tensor | None]] = {
    **{a: _decoder for a in ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "olmo2", "exaone4", "granite", "phi3", "qwen3moe")},
    "lfm2": _lfm2,
    "deepseek2": _deepseek2,
}


def graph_peak(p: dict[str, Any], n_tokens: int, n_outputs: int) -> int | None:
    c = Ctx(p, n_tokens, n_outputs)
    out = BUILDERS[p["arch"]](c, p["arch"])
    if out is None:
        return None
    c.gf.expand(out)
    return allocate(c.gf)


_CACHE: dict[str, int] = {}


def compute_buffer(p: dict[str, Any], n_ubatch: int, n_outputs_pp: int, n_seqs: int = 1) -> int | None:
    """llama_context::sched_reserve (src/llama-context.cpp): the pp graph, the tg
    graph (one token a sequence), the pp graph again; the buffer is the largest.
    With ``n_seqs`` (n_seq_max) > 1 the pp ubatch is ``n_ubatch`` tokens rounded up
    to a multiple of ``n_seqs`` (graph_reserve) and the tg one ``n_seqs`` tokens,
    one output each. None for an architecture whose graph is not rebuilt here."""
    if p["arch"] not in BUILDERS:
        return None
    n_seqs = max(n_seqs, 1)
    key = repr((sorted(p.items()), n_ubatch, n_outputs_pp, n_seqs))
    if key not in _CACHE:
        if len(_CACHE) > 256:
            _CACHE.clear()
        n_pp = -(-n_ubatch // n_seqs) * n_seqs
        try:
            pp = graph_peak(p, n_pp, min(n_outputs_pp, n_pp))
            tg = graph_peak(p, n_seqs, n_seqs) if pp is not None else None
        except (KeyError, IndexError, ValueError, ZeroDivisionError):
            pp = tg = None  # a header this graph cannot be built from (a cache type or shape it does not know)
        if pp is None:
            return None
        _CACHE[key] = max(pp, tg or 0)
    return _CACHE[key]


def _layers_to_build(shape: Any, has_swa: bool) -> list[int]:
    """The layers whose graph is replayed. Layers repeat with the model's period
    (1, or the sliding-window pattern's), and from the second period on the
    allocator is in the same state at each period's start, so a deep model is
    replayed as its first two periods and its last one (the last layer differs:
    it selects the output rows). This keeps a plan of a 64-layer model in milliseconds."""
    L = shape.n_layer
    kinds = [(has_swa and il in shape.swa_layers, shape.has_kv(il), il in shape.recurrent_layers,
              shape.n_ff[il] if il < len(shape.n_ff) else 0, shape.n_head_kv[il]) for il in range(L)]
    period = next((q for q in range(1, L // 4 + 1) if all(kinds[i] == kinds[i % q] for i in range(L))), L)
    if L <= 4 * period:
        return list(range(L))
    keep = list(range(2 * period)) + list(range(L - period, L))
    # the last layer of each cache must stay (its masks are freed after it)
    return sorted(set(keep))


def params(shape: Any, *, cells: int, swa_cells: int, type_k: str, type_v: str, flash_attn: bool) -> dict[str, Any]:
    """The graph's hyperparameters from a ``planner.ModelShape`` and the load settings."""
    L = shape.n_layer
    has_swa = bool(shape.swa_layers and shape.n_swa)
    heads = [shape.head_dims(il) for il in range(L)]
    n_embd_v_max = max((heads[il][1] * shape.n_head_kv[il] for il in range(L)), default=0)

    def cache(layers: list[int], n_kv: int) -> dict[str, Any]:
        hk = {heads[il][0] for il in layers}
        hv = {heads[il][1] for il in layers}
        k_all = hk.pop() if len(hk) == 1 else -1
        v_all = hv.pop() if len(hv) == 1 else -1
        nrot, v_side = hadamard_sides(k_all, 0 if shape.mla else v_all, shape.head_dim_k, shape.head_dim_v, type_k, type_v)
        v_rot = v_side > 0
        if shape.recurrent_layers and has_swa:
            # src/llama-graph.cpp build_inp_mem_hybrid_iswa builds no rotation inputs
            # (unlike build_attn_inp_kv_impl and build_attn_inp_kv_iswa)
            nrot, v_rot = 0, False
        return {"n_kv": n_kv, "type_k": type_k, "type_v": type_v, "k_rot": nrot, "v_rot": v_rot,
                "head_k": [h[0] for h in heads], "head_v": [h[1] for h in heads], "n_head_kv": list(shape.n_head_kv),
                "n_embd_v_max": n_embd_v_max, "has_v": not shape.mla}

    kv_layers = [il for il in range(L) if shape.has_kv(il)]
    caches: dict[str, Any] = {}
    base = [il for il in kv_layers if not (has_swa and il in shape.swa_layers)]
    swa = [il for il in kv_layers if has_swa and il in shape.swa_layers]
    if base or not has_swa:
        caches["base"] = cache(base, cells)
    if swa:
        caches["swa"] = cache(swa, swa_cells)
    return {
        "arch": shape.architecture, "n_layer": L, "layers": _layers_to_build(shape, has_swa), "n_embd": shape.n_embd, "n_head": max(shape.n_head),
        "head_k": shape.head_dim_k, "head_v": shape.head_dim_v, "n_head_kv": list(shape.n_head_kv),
        "n_ff": list(shape.n_ff), "n_vocab": shape.n_vocab, "swa_layers": shape.swa_layers if has_swa else frozenset(),
        "iswa": has_swa, "caches": caches, "recurrent_layers": shape.recurrent_layers,
        "l_cache": shape.n_embd_r // max(shape.n_embd, 1) + 1, "mla": shape.mla, "mla_dims": shape.mla_dims,
        "n_expert": shape.n_expert, "n_expert_used": shape.n_expert_used, "n_ff_exp": shape.n_ff_exp, "flash_attn": flash_attn,
        "attn_softcap": shape.architecture == "gemma2", "final_softcap": shape.architecture == "gemma2",
    }


def replay(shape: Any, n_ubatch: int, n_outputs: int, n_seqs: int = 1, **settings: Any) -> int | None:
    """The compute buffer llama.cpp allocates for ``shape`` (a planner.ModelShape)
    with these load settings (see ``params``) and ``n_seqs`` sequences in one
    unified cache, or None where the graph is not rebuilt here or cannot be
    built from this header."""
    if shape.architecture not in BUILDERS:
        return None
    try:
        p = params(shape, **settings)
    except (KeyError, IndexError, ValueError, ZeroDivisionError):
        return None
    return compute_buffer(p, n_ubatch, n_outputs, n_seqs)
