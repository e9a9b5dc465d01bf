"""What korch shows people: the Markdown and HTML reports of an optimize run, and the model summary of
``korch inspect``. Reads the IR, the plan and the executable's manifest; runs nothing."""
