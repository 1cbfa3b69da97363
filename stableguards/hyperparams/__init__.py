"""Scheduled hyperparameters (lr, betas, momentum) without recompiles.

``rewrite`` turns the uses AOTAutograd cannot lift into ones it can (plain FX
graph surgery), ``state`` keeps what a compile needs between hooks,
``messages`` counts and explains, ``hooks`` connects them to AOTAutograd and
inductor.
"""
