"""The command line's building blocks, above the public face.

``cli.py`` (the top floor, the ``vfl`` group) keeps the group and its error translation; what the
commands share (option builders, the network security object from options, logging) lives in
:mod:`vfl.commands.common`, and a new command lands as its own module here (a thin click wrapper
over the library) that ``cli.py`` registers with ``main.add_command``.
"""
