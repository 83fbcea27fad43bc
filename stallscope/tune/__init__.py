"""``stallscope tune``: try the fixes on the user's own job, measure them, keep the ones that win.

Two sides, which talk only through the environment and files (STYLE: a driver above the hooks):

* the driver (``search``, ``runner``, ``stats``, ``record``, ``render``; ``cli/tune.py`` is its
  command) runs the user's command as child processes, each a *trial* with some settings, and
  compares trials interleaved;
* the trial (``trial``, ``loaders``, ``lightning``) runs inside the child: the hooks ask it, only
  when ``STALLSCOPE_TRIAL`` is set, to apply the settings to the objects they see and to stop the
  loop after its budget of steps. ``plan`` is what the two share: the trial's plan, as variables.
"""
