"""The call tables that rule modules fill when they are imported and the engine reads
(``builder``, ``builtins.call_builtin``, ``torch_rules.call_torch_function``). Kept at
the bottom of capture so that a module registering its rules imports no module that
reads them: ``tracer`` imports every rule module before any trace."""

#: Python callable (builtins, math, operator, functools, stdlib) -> rule(tx, *args, **kwargs)
BUILTINS: dict = {}

#: torch callable -> rule(tx, args, kwargs): answered at trace time, or a one-node call
#: the rule builds itself (torch.cond, torch.while_loop)
CONST_FOLD: dict = {}
