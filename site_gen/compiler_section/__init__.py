"""What the compiler made of each stage, read from the committed compiler facts: the #compiler
section of a stage page (section), its stage-to-stage changes (changes) and the overview's table
(overview). Nothing here compiles: hopattn.compiler makes the facts.
"""
