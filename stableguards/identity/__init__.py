"""Cross-process identity, shared by every part: what an object is, told the same way in every
process, so that a check made in one process can be proved in another.

* ``objects``: the identity rule (``identity(obj)``, ``Identities``): code, closures, classes
  along their MRO, modules and builtins by import name, optimizers by state;
* ``reads``: a function also by everything its code reads (for graphs that run functions
  Dynamo never traced);
* ``compiled_autograd``: the functions compiled autograd puts in its graphs;
* ``fx_home``: a module name for code that runs in torch.fx's own globals;
* ``names``: the names and kinds the rules build on; ``covers``: what each kind covers.

Plain Python: the hook layer hands it the objects.
"""
