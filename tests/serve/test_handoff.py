"""serve/handoff.py: the engine thread's emits reach their queues in order, with one loop wake-up per burst."""

from __future__ import annotations

import asyncio
import threading

from localllm.serve import handoff


def _count_wakeups(loop: asyncio.AbstractEventLoop) -> list:
    """The callbacks handed to ``loop.call_soon_threadsafe`` (each one wakes the loop), as they come."""
    wakeups: list = []
    real = loop.call_soon_threadsafe

    def counting(callback, *args, **kw):
        wakeups.append(callback)
        return real(callback, *args, **kw)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign, assignment]
    return wakeups


def test_a_burst_of_emits_wakes_the_loop_once_and_arrives_in_order() -> None:
    loop = asyncio.new_event_loop()
    try:
        wakeups = _count_wakeups(loop)
        box = handoff.outbox(loop)
        assert handoff.outbox(loop) is box

        async def scenario() -> None:
            queues: list[asyncio.Queue] = [asyncio.Queue(), asyncio.Queue()]

            def engine_step() -> None:  # 8 sequences' tokens of one step, from another thread
                for i in range(8):
                    box.post(queues[i % 2], ("text", str(i)))

            t = threading.Thread(target=engine_step)
            t.start()
            t.join()  # the loop is held here: all 8 posts come before it can drain
            got = [[await q.get() for _ in range(4)] for q in queues]
            assert got == [[("text", "0"), ("text", "2"), ("text", "4"), ("text", "6")],
                           [("text", "1"), ("text", "3"), ("text", "5"), ("text", "7")]]
            assert len(wakeups) == 1
            box.post(queues[0], ("done", "stop"))  # once drained, the next emit wakes the loop again
            assert await queues[0].get() == ("done", "stop")
            assert len(wakeups) == 2

        loop.run_until_complete(scenario())
    finally:
        loop.close()


def test_an_emit_after_the_loop_closed_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    box = handoff.outbox(loop)
    loop.close()
    box.post(asyncio.Queue(), ("text", "late"))  # the server is gone: no exception in the engine thread


def test_the_engine_threads_posts_wait_for_flush_and_other_threads_do_not() -> None:
    loop = asyncio.new_event_loop()
    try:
        wakeups = _count_wakeups(loop)
        box = handoff.outbox(loop)

        async def scenario() -> None:
            q: asyncio.Queue = asyncio.Queue()

            def engine() -> None:
                handoff.ENGINE.engine_thread(True)
                try:
                    box.post(q, ("text", "a"))
                    box.post(q, ("text", "b"))
                    assert wakeups == []  # held: the loop is not woken in the engine's gap
                    handoff.ENGINE.flush()  # as before llama_decode
                    assert len(wakeups) == 1
                finally:
                    handoff.ENGINE.engine_thread(False)

            t = threading.Thread(target=engine)
            t.start()
            t.join()
            assert [await q.get(), await q.get()] == [("text", "a"), ("text", "b")]
            box.post(q, ("error", "stopping"))  # another thread (abort from the loop's side): at once
            assert await q.get() == ("error", "stopping") and len(wakeups) == 2

        loop.run_until_complete(scenario())
    finally:
        loop.close()
