"""Pure rules the front, the clusters and the simulator apply alike: quotas, rate limits, request
validation and abuse judgement. Functions of their inputs: no clock, no I/O."""
