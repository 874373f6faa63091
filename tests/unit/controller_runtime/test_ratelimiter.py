"""Rate limiters: exact delays, with a fake clock where time matters."""

from __future__ import annotations

import pytest

from controller_runtime.ratelimiter import (
    DEFAULT_BUCKET_MAX_WAIT,
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    ItemFastSlowRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    default_controller_rate_limiter,
)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_exponential_doubles_from_base_and_caps() -> None:
    rl: ItemExponentialFailureRateLimiter[str] = ItemExponentialFailureRateLimiter()
    delays = [rl.when("a") for _ in range(20)]
    assert delays[:6] == [0.005, 0.01, 0.02, 0.04, 0.08, 0.16]
    assert delays == [min(0.005 * 2**n, 1000.0) for n in range(20)]
    # 0.005 * 2**17 = 655.36 s is the last uncapped delay; 2**18 would be 1310.72 s.
    assert delays[17] == pytest.approx(655.36)
    assert delays[18] == 1000.0
    assert rl.num_requeues("a") == 20


def test_exponential_is_per_item_and_forget_resets() -> None:
    rl: ItemExponentialFailureRateLimiter[str] = ItemExponentialFailureRateLimiter(0.001, 1.0)
    assert [rl.when("a") for _ in range(3)] == [0.001, 0.002, 0.004]
    assert rl.when("b") == 0.001
    rl.forget("a")
    assert rl.num_requeues("a") == 0
    assert rl.num_requeues("b") == 1
    assert rl.when("a") == 0.001


def test_exponential_never_overflows() -> None:
    rl: ItemExponentialFailureRateLimiter[str] = ItemExponentialFailureRateLimiter(5.0, 1e300)
    rl._failures["a"] = 10_000  # as if it had failed 10k times
    assert rl.when("a") == 1e300
    rl._failures["a"] = 10**30
    assert rl.when("a") == 1e300


def test_bucket_burst_then_qps_spacing() -> None:
    clock = FakeClock()
    rl: BucketRateLimiter[str] = BucketRateLimiter(qps=10.0, burst=100, clock=clock)
    assert [rl.when(str(i)) for i in range(100)] == [0.0] * 100
    # Tokens are shared and reserved: the 101st waits one token (0.1 s), the 102nd two, ...
    assert [rl.when("x") for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    clock.advance(0.3)  # three tokens refilled, all three already reserved
    assert rl.when("y") == pytest.approx(0.1)
    clock.advance(100.0)  # refill is capped at burst
    assert [rl.when("z") for _ in range(100)] == [0.0] * 100
    assert rl.when("z") == pytest.approx(0.1)
    assert rl.num_requeues("z") == 0


def test_bucket_wait_is_capped_and_debt_does_not_grow_past_the_cap() -> None:
    clock = FakeClock()
    rl: BucketRateLimiter[str] = BucketRateLimiter(qps=10.0, burst=1, max_wait=2.0, clock=clock)
    waits = [rl.when("a") for _ in range(50)]
    assert waits[0] == 0.0
    assert waits[1:21] == pytest.approx([0.1 * n for n in range(1, 21)])
    assert waits[20] == pytest.approx(2.0)
    assert waits[21:] == [2.0] * 29
    # Without the cap the bucket would owe 49 tokens (4.9 s); capped, it owes 2 s worth, so
    # after 2 s it is back to zero debt and the next call waits a single token.
    clock.advance(2.0)
    assert rl.when("a") == pytest.approx(0.1)


def test_bucket_uncapped_matches_client_go() -> None:
    clock = FakeClock()
    rl: BucketRateLimiter[str] = BucketRateLimiter(qps=10.0, burst=100, max_wait=None, clock=clock)
    waits = [rl.when(str(i)) for i in range(10_100)]
    assert waits[-1] == pytest.approx(1000.0)  # k/k#104554: 10k items, ~16 min


def test_bucket_default_cap() -> None:
    clock = FakeClock()
    rl: BucketRateLimiter[str] = BucketRateLimiter(clock=clock)
    assert rl.max_wait == DEFAULT_BUCKET_MAX_WAIT == 60.0
    waits = [rl.when(str(i)) for i in range(10_100)]
    assert max(waits) == 60.0
    assert waits[699] == pytest.approx(60.0)  # burst 100 + 600 tokens in 60 s
    assert waits[698] < 60.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"qps": 0.0}, "qps"), ({"burst": 0}, "burst"), ({"max_wait": -1.0}, "max_wait")],
)
def test_bucket_rejects_bad_settings(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BucketRateLimiter(**kwargs)  # type: ignore[arg-type]


def test_max_of_takes_longest_and_forgets_everywhere() -> None:
    clock = FakeClock()
    rl: MaxOfRateLimiter[str] = MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0),
        BucketRateLimiter(qps=10.0, burst=2, clock=clock),
    )
    # burst 2: the bucket allows two, then spaces by 0.1 s; exponential grows from 5 ms.
    assert rl.when("a") == 0.005
    assert rl.when("a") == 0.01
    assert rl.when("a") == pytest.approx(0.1)  # bucket wins over 20 ms
    assert rl.num_requeues("a") == 3
    rl.forget("a")
    assert rl.num_requeues("a") == 0
    clock.advance(10.0)
    assert rl.when("a") == 0.005


def test_max_of_needs_a_limiter() -> None:
    with pytest.raises(ValueError, match="at least one"):
        MaxOfRateLimiter[str]()


def test_fast_slow() -> None:
    rl: ItemFastSlowRateLimiter[str] = ItemFastSlowRateLimiter(0.01, 5.0, 3)
    assert [rl.when("a") for _ in range(5)] == [0.01, 0.01, 0.01, 5.0, 5.0]
    assert rl.num_requeues("a") == 5
    assert rl.when("b") == 0.01
    rl.forget("a")
    assert rl.num_requeues("a") == 0
    assert rl.when("a") == 0.01


def test_default_controller_rate_limiter() -> None:
    clock = FakeClock()
    rl: MaxOfRateLimiter[str] = default_controller_rate_limiter(clock=clock)
    assert [rl.when("a") for _ in range(4)] == [0.005, 0.01, 0.02, 0.04]
    # The shared bucket: 96 more calls exhaust burst 100, the 101st waits 0.1 s.
    for i in range(96):
        rl.when(f"k{i}")
    assert rl.when("fresh") == pytest.approx(0.1)
    # Per-item growth still caps at 1000 s.
    clock.advance(1e6)
    for _ in range(30):
        last = rl.when("b")
    assert last == 1000.0
    limiter: RateLimiter[str] = rl  # satisfies the protocol
    limiter.forget("b")
    assert limiter.num_requeues("b") == 0
