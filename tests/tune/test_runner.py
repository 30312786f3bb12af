"""The measuring loop on fake measurements and a fake clock: alternation, the
time left, the quality check's place, what the plan refuses, Ctrl+C."""

from __future__ import annotations

import pytest

from localllm.tune.candidates import FLASH_ATTN, KV_TYPE, THREADS, UBATCH, Setting
from localllm.tune.choose import Run
from localllm.tune.runner import BecameBusy, Plan, Quality, Tuner

BASE = Setting(ubatch=512, flash_attn="on", kv_type="f16", threads=2)
STAGES = [(FLASH_ATTN, ["on", "off"]), (KV_TYPE, ["f16", "q8_0", "q4_0"]), (UBATCH, [128, 256, 512]), (THREADS, [2, 1])]


class Fake:
    """Decode rates by setting (a q8_0 cache and ubatch 256 faster), each run taking 2 s of a fake clock."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.order: list[tuple[Setting, int]] = []
        self.now = 0.0
        self.stop_after = stop_after
        self.quality_at: int | None = None

    def clock(self) -> float:
        return self.now

    def measure(self, s: Setting, rnd: int) -> Run:
        if self.stop_after is not None and len(self.order) == self.stop_after:
            raise KeyboardInterrupt
        self.order.append((s, rnd))
        self.now += 2.0
        tg = 50.0 * (1.3 if s.kv_type == "q8_0" else 1.0) * (1.2 if s.ubatch == 256 else 1.0) * (1.5 if s.kv_type == "q4_0" else 1.0)
        return Run({128: 1000.0}, {128: tg})

    def plan(self, s: Setting) -> Plan:
        return Plan(True, (0, 100 << 20))

    def quality(self, types: list[str]) -> dict[str, Quality]:
        self.quality_at = len(self.order)
        return {"q8_0": Quality(0.004, 0.05, 0.97), "q4_0": Quality(0.15, 1.4, 0.8)}


def tuner(fake: Fake, stages=STAGES, lines: list[str] | None = None) -> Tuner:
    return Tuner(BASE, stages, rounds=2, measure=fake.measure, plan=fake.plan, quality=fake.quality,
                 progress=(lines.append if lines is not None else None), clock=fake.clock)


def test_candidates_alternate_and_the_best_is_kept() -> None:
    fake = Fake()
    lines: list[str] = []
    t = tuner(fake, lines=lines)
    best = t.run()
    fa = [(s.flash_attn, r) for s, r in fake.order[:4]]
    assert fa == [("on", 0), ("off", 0), ("on", 1), ("off", 1)]  # A B A B
    assert best == Setting(ubatch=256, flash_attn="on", kv_type="q8_0", threads=2)  # q4_0 is faster but over the KL bound
    assert fake.quality_at == 4  # once, after the first stage and before the cache stage's runs
    assert len(fake.order) == t.total == 20
    assert lines[0].startswith("[1/20] flash-attn on, round 1/2") and "estimating" in lines[0]
    assert "about 36 s left" in lines[2]  # 2 runs of 2 s done, 18 to go


def test_a_value_the_plan_refuses_is_not_run() -> None:
    fake = Fake()
    t = Tuner(BASE, [(KV_TYPE, ["f16", "q8_0", "q4_0"])], rounds=2, measure=fake.measure, quality=fake.quality, clock=fake.clock,
              plan=lambda s: Plan(s.kv_type != "q8_0", (0, 1), None if s.kv_type != "q8_0" else "context 1024 instead of 4096"))
    t.run()
    assert {s.kv_type for s, _ in fake.order} == {"f16", "q4_0"} and t.total == 4
    assert t.stages[0].chosen is not None and t.stages[0].chosen.setting.kv_type == "f16"


def test_skipped_stages_are_said_and_not_run() -> None:
    fake = Fake()
    t = tuner(fake, stages=[(THREADS, "not tuned: --threads 1 sets it to 1"), (UBATCH, [128, 512])])
    t.run()
    assert t.stages[0].skipped == "not tuned: --threads 1 sets it to 1" and {s.threads for s, _ in fake.order} == {2}
    assert [st.key for st in t.decided()] == [UBATCH]


@pytest.mark.parametrize("stop, decided", [(0, []), (1, []), (2, [FLASH_ATTN]), (6, [FLASH_ATTN]), (7, [FLASH_ATTN, KV_TYPE])])
def test_ctrl_c_keeps_the_stages_measured(stop: int, decided: list[str]) -> None:
    """Interrupted at run ``stop``: a stage counts when every candidate ran at least once."""
    fake = Fake(stop_after=stop)
    t = tuner(fake)
    with pytest.raises(KeyboardInterrupt):
        t.run()
    t.interrupted()
    assert [st.key for st in t.decided()] == decided
    assert all(not st.done for st in t.stages[len(decided):])


def test_a_stage_the_machine_was_busy_during_is_not_decided() -> None:
    """The check after each stage: a program that took the CPU meanwhile stops the tuning; the stages before it stand."""
    fake = Fake()
    answers = iter([None, "yes (pid 12) is using 98% of a core"])
    t = Tuner(BASE, STAGES, rounds=2, measure=fake.measure, plan=fake.plan, quality=fake.quality, clock=fake.clock,
              busy=lambda: next(answers))
    with pytest.raises(BecameBusy) as exc:
        t.run()
    assert exc.value.key == KV_TYPE and "yes (pid 12)" in exc.value.why
    t.interrupted()
    assert [st.key for st in t.decided()] == [FLASH_ATTN]
    assert t.stages[1].to_dict(0.01)["busy"] == "yes (pid 12) is using 98% of a core" and t.stages[1].chosen is None
