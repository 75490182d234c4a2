-- Flow control and scheduling: per-queue settings (pause, global concurrency and rate limits),
-- the last enqueued slot of each periodic task, and cancel requests for running jobs.

-- A queue with no row here is unpaused and unlimited. The claim reads these rows; it locks the
-- limited ones (see `lock_queues`) so that limits hold across every worker.
CREATE TABLE {schema}.queues (
    name              text PRIMARY KEY,
    paused            boolean          NOT NULL DEFAULT false,
    concurrency_limit int              CHECK (concurrency_limit >= 0),
    rate_limit        int              CHECK (rate_limit >= 0),
    rate_period       double precision CHECK (rate_period > 0),
    -- Claim times inside the current rate window, at most rate_limit of them.
    recent_starts     timestamptz[]    NOT NULL DEFAULT '{}',
    updated_at        timestamptz      NOT NULL DEFAULT now(),
    CHECK ((rate_limit IS NULL) = (rate_period IS NULL))
);

-- Each periodic task's newest slot that has been enqueued: a slot is enqueued by whichever
-- worker first moves `last_slot` past it, so every slot runs once with no leader.
CREATE TABLE {schema}.periodic (
    name       text PRIMARY KEY,
    last_slot  timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- A cancel request for a running job; its worker sees it through NOTIFY or its next poll.
ALTER TABLE {schema}.jobs ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
