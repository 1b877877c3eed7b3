"""The measured numbers on the site: each stage's #benchmark table and the overview's lineage
tables and environment (tables), and the progression chart (chart), all from bench/results.
"""
