"""Optimizer steps under torch.compile: fewer, cheaper guards, and code that dies with its optimizer.

``lives`` holds the reasoning and the plain bookkeeping (and ``static_grads``
for cudagraphs), ``state`` what this process keeps, ``messages`` what it
counts and explains, ``hooks`` where Dynamo is told.
"""
