"""The level-triggered wake-up flag (``aioqueue._signal.Flag``), with no worker and no database."""

from __future__ import annotations

import anyio
import anyio.lowlevel

from aioqueue._signal import Flag


async def test_a_raised_flag_is_seen_at_once_until_cleared() -> None:
    flag = Flag()
    assert not flag.is_set()
    flag.set()
    flag.set()  # again: no effect
    assert flag.is_set()
    assert await flag.wait(0)
    flag.clear()
    assert not flag.is_set()
    assert not await flag.wait(0.01)


async def test_a_set_between_clear_and_wait_is_not_lost() -> None:
    flag = Flag()
    flag.set()
    flag.clear()
    flag.set()
    with anyio.fail_after(5):
        assert await flag.wait()


async def test_set_wakes_the_waiter() -> None:
    flag = Flag()
    woke: list[bool] = []

    async def waiter() -> None:
        woke.append(await flag.wait(5))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.lowlevel.checkpoint()
            flag.set()
    assert woke == [True]


async def test_every_waiter_is_woken_and_a_cancelled_wait_leaves_the_flag_usable() -> None:
    flag = Flag()
    woke: list[bool] = []

    async def waiter() -> None:
        woke.append(await flag.wait(5))

    with anyio.move_on_after(0.01) as scope:
        await flag.wait()
    assert scope.cancelled_caught
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(waiter)
            await anyio.lowlevel.checkpoint()
            flag.set()
    assert woke == [True, True]
    flag.clear()
    assert not await flag.wait(0)
