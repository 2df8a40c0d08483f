"""Extensions of the Transformer discussed beside the paper: each is off by default and exact when off, and reaches
the paper's classes only as a subclass or an attention hook.

An extension is one module here, named after its config section (cutoff.py: `cutoff.rate`), that holds
    its section      a dataclass, every field a `param(default, help)`, the extension off by default
    its rules        a function raising ConfigError with one line (what is wrong, how to fix it)
    its code         the model subclass, training objective, resegmentation or weight average it installs
    its registration `EXTENSION = Extension(...)` (sections.py): the section, the rules, its kind, how it is
                     installed, and its arms in the extension benchmark
config/schema.py finds every module here but builder.py and adds its section to `Config`; validation, the keys,
docs/config.md and the benchmark's arms follow from the registration, and builder.py installs the ones a config
switches on. Adding one is its module, its test and its row in docs/extensions.md's table of switches.

    builder.py   a Config -> model, loss, objective, optimizer, weight average, resegmentation
"""
