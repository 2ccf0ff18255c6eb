"""Chapter 10: the transformer, stacking layers. The tasks, measurements and trained models.

    induction   ... A B ... A -> B: a task one layer cannot solve and two can; previous-token and
                induction scores of heads; zeroing one head (an ablation)
    pronoun     the trophy and the suitcase: templated languages where "it" needs earlier
                candidates and a property word; PairsTask lists m (thing, container) pairs before
                the question, so a running summary would have to keep all of them
    composition query or key composition: chapter 06's question-first recall with one and two
                blocks, patching layer 1's queries and keys separately; its shipped models and
                python -m course_lib.stacking.composition
    text        real English offline: CPython's reference manual (pydoc_data.topics), characters
                as tokens; what each head of a trained model does on a real sentence
    pretrained  the small trained models the lecture loads, and the seeded command that makes them:
                python -m course_lib.stacking.pretrained [--quick] [NAME ...]
"""
