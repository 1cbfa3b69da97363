"""Why a compile happened: FX-graph cache misses diffed by key component, recompiles by guard.

``ledger`` keeps recent keys beside the cache and finds the closest to a miss
(plain logic); ``messages`` words what differs; ``hooks`` reads inductor's key
components and Dynamo's recompile reasons.
"""
