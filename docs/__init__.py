"""The docs site: Markdown pages by task, built by mkdocs (``mkdocs.yml``), and
``docs.gen``, which writes their generated parts from the code."""
