"""The admin's catalog forms: an image's ports and environment as rows of fields rather than
JSON, each bad row named in the field's errors, and its command as a shell-quoted line or one
argument per row; a MIG profile's start slices as boxes to tick. The rules are the model's
(port_errors, env_errors, command_errors, MigProfile.clean)."""

import shlex

from django import forms
from django.core.exceptions import ValidationError
from django.template.loader import render_to_string

from console import integers
from console.catalog.models import (
    APPS,
    MAX_ARGS,
    MAX_ENV,
    MIG_SLICES,
    Image,
    MigProfile,
    command_errors,
    env_errors,
    port_errors,
)

# Blank rows under the filled ones: more come with each "Save and continue editing".
EXTRA_ROWS = 3
# No more rows are read than a form can hold, whatever a request sends.
MAX_ROWS = max(MAX_ENV, MAX_ARGS) + EXTRA_ROWS + 1


class RowsWidget(forms.Widget):
    """A table of rows, one input per column, posted as <name>-<row>-<column>; no script."""

    template = "admin/catalog/rows_widget.html"

    def __init__(self, columns: list[tuple[str, str, str]], attrs=None):
        """columns: (key, label, input type: "number", "text" or "app")."""
        super().__init__(attrs)
        self.columns = columns

    def value_from_datadict(self, data, files, name) -> list[dict[str, str]]:
        rows = []
        for index in range(MAX_ROWS):
            keys = [f"{name}-{index}-{key}" for key, _, _ in self.columns]
            if not any(key in data for key in keys):
                break
            rows.append({key: data.get(f"{name}-{index}-{key}", "") for key, _, _ in self.columns})
        return rows

    def value_omitted_from_data(self, data, files, name) -> bool:
        return f"{name}-0-{self.columns[0][0]}" not in data

    def render(self, name, value, attrs=None, renderer=None):
        filled = [
            {key: "" if row.get(key) is None else str(row.get(key)) for key, _, _ in self.columns}
            for row in value or []
        ]
        blank = {key: "" for key, _, _ in self.columns}
        rows = [
            [
                (f"{name}-{index}-{key}", _input(kind, row[key]), row[key], label)
                for key, label, kind in self.columns
            ]
            for index, row in enumerate([*filled, *[blank] * EXTRA_ROWS])
        ]
        context = {"name": name, "columns": self.columns, "rows": rows, "apps": APPS}
        return render_to_string(self.template, context)


def _input(kind: str, value: str) -> str:
    """A text that holds a line break is edited in a textarea (an input would drop it)."""
    return "textarea" if kind == "text" and "\n" in value else kind


def _filled(rows: list[dict[str, str]]) -> list[tuple[int, dict[str, str]]]:
    """(row number from 1, row) of the rows with anything typed in them."""
    return [
        (number, row)
        for number, row in enumerate(rows, start=1)
        if any(value.strip() for value in row.values())
    ]


def _number_or_text(text: str) -> int | str:
    """A row's port as a number when it spells one, else as typed (for port_errors to name)."""
    try:
        return integers.parse(text)
    except integers.NotAWholeNumber:
        return text


class PortsField(forms.Field):
    """[{"port": 8888, "name": "Jupyter", "app": "jupyter"}] from rows of port, name, app."""

    def __init__(self, **kwargs):
        columns = [("port", "Port", "number"), ("name", "Name", "text"), ("app", "App", "app")]
        super().__init__(widget=RowsWidget(columns), required=False, **kwargs)

    def to_python(self, value) -> list[dict]:
        ports: list[dict] = []
        errors: list[str] = []
        rows_of: dict[object, int] = {}
        for number, row in _filled(value or []):
            port, name, app = (row[key].strip() for key in ("port", "name", "app"))
            entry = {"port": _number_or_text(port), "name": name}
            if app:
                entry["app"] = app
            problems = port_errors([entry])
            if not problems and entry["port"] in rows_of:
                problems = [f"port {port} is already in row {rows_of[entry['port']]}."]
            errors += [f"Row {number}: {problem}" for problem in problems]
            rows_of.setdefault(entry["port"], number)
            ports.append(entry)
        if errors:
            raise ValidationError(errors)
        return ports


class EnvField(forms.Field):
    """{"NAME": "value"} from rows of name and value."""

    def __init__(self, **kwargs):
        columns = [("name", "Name", "text"), ("value", "Value", "text")]
        super().__init__(widget=RowsWidget(columns), required=False, **kwargs)

    def prepare_value(self, value):
        if isinstance(value, dict):
            return [{"name": name, "value": text} for name, text in value.items()]
        return value

    def to_python(self, value) -> dict[str, str]:
        env: dict[str, str] = {}
        errors: list[str] = []
        rows_of: dict[str, int] = {}
        for number, row in _filled(value or []):
            name = row["name"].strip()  # a value keeps its spaces
            if not name:
                problems = ["a value needs a name."]
            elif name in rows_of:
                problems = [f"{name} is already in row {rows_of[name]}."]
            else:
                problems = env_errors({name: row["value"]})
            errors += [f"Row {number}: {problem}" for problem in problems]
            rows_of.setdefault(name, number)
            env[name] = row["value"]
        if len(env) > MAX_ENV:
            errors.append(f"At most {MAX_ENV} variables.")
        if errors:
            raise ValidationError(errors)
        return env


class CommandWidget(forms.Widget):
    """A line to type the command as a shell would read it, and rows of one argument each
    (for arguments that hold line breaks, or to paste them one by one)."""

    template = "admin/catalog/command_widget.html"

    def __init__(self, attrs=None):
        super().__init__(attrs)
        self.rows = RowsWidget([("arg", "Argument", "text")])

    def value_from_datadict(self, data, files, name) -> dict:
        rows = self.rows.value_from_datadict(data, files, name)
        return {"line": data.get(f"{name}-line", ""), "rows": [row["arg"] for row in rows]}

    def value_omitted_from_data(self, data, files, name) -> bool:
        return f"{name}-line" not in data and self.rows.value_omitted_from_data(data, files, name)

    def render(self, name, value, attrs=None, renderer=None):
        value = value or {"line": "", "rows": []}
        rows = self.rows.render(name, [{"arg": arg} for arg in value["rows"]])
        context = {"name": name, "line": value["line"], "rows": rows}
        return render_to_string(self.template, context)


class CommandField(forms.Field):
    """["sh", "-c", "echo $HOME"] from the line `sh -c 'echo $HOME'` (shlex.split) or from
    rows of one argument each; shown as a line (shlex.join) unless an argument holds a line
    break."""

    widget = CommandWidget

    def __init__(self, **kwargs):
        super().__init__(required=False, **kwargs)

    def prepare_value(self, value):
        if isinstance(value, list):
            if any("\n" in arg for arg in value):
                return {"line": "", "rows": value}
            return {"line": shlex.join(value), "rows": []}
        return value

    def to_python(self, value) -> list[str]:
        value = value or {"line": "", "rows": []}
        line = value["line"].strip()
        rows = [arg for arg in value["rows"] if arg != ""]
        if line and rows:
            raise ValidationError("Give the command as a line or as rows, not both.")
        if rows:
            command = rows
        else:
            try:
                command = shlex.split(line)
            except ValueError as exc:
                raise ValidationError(
                    f"The line cannot be read as a shell would ({exc}): close each quote, or "
                    "give the arguments as rows."
                ) from exc
        if problems := command_errors(command):
            raise ValidationError(problems)
        return command


class ImageForm(forms.ModelForm):
    ports = PortsField(
        help_text='The web ports it serves. App "jupyter": each instance gets a token in '
        "JUPYTER_TOKEN and the port opens signed in with it."
    )
    env = EnvField(help_text="Its default environment; a launch may add to it or override it.")
    command = CommandField(
        help_text="Its default command, as you would type it in a shell (python train.py "
        "--lr 3e-4), or one argument per row; empty: the image's own CMD."
    )

    class Meta:
        model = Image
        fields = [
            "name",
            "reference",
            "cuda_version",
            "description",
            "command",
            "env",
            "ports",
            "restart_policy",
            "active",
            "pre_pull",
        ]
        labels = {"cuda_version": "CUDA version", "pre_pull": "Pre-pull"}


class MigProfileForm(forms.ModelForm):
    """The start slices as boxes, one per memory slice, rather than a JSON list."""

    starts = forms.TypedMultipleChoiceField(
        choices=[(slice_, str(slice_)) for slice_ in range(MIG_SLICES)],
        coerce=int,
        widget=forms.CheckboxSelectMultiple,
        help_text="the memory slices an instance may start at",
    )

    class Meta:
        model = MigProfile
        fields = ["name", "compute_slices", "size", "starts", "memory_mib"]
        field_classes = dict.fromkeys(["compute_slices", "size", "memory_mib"], integers.FormField)
