"""Generated instance names: readable, valid, and free among the tenant's live instances."""

import re

from console.instances import names, services


def test_a_generated_name_is_the_specs_code_and_two_words_and_a_valid_name():
    name = names.generate("a100-1g.10gb", lambda candidate: False)
    assert re.fullmatch(r"a100-1g-10gb-[a-z]+-[a-z]+", name)
    assert services.NAME_PATTERN.match(name)


def test_it_avoids_taken_names_and_a_long_code_still_gives_a_valid_name():
    taken = set()
    for _ in range(50):
        taken.add(names.generate("a100-quarter", taken.__contains__))
    assert len(taken) == 50
    crowded = names.generate("x" * 80, lambda candidate: True)  # every readable one taken
    assert services.NAME_PATTERN.match(crowded) and len(crowded) <= 63
    assert re.search(r"-[0-9a-f]{6}$", crowded)
