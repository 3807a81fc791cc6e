// The launch form: what each spec does in the chosen region (fits now, and how many, queues,
// or cannot be launched: no such hardware there, over the tenant's quota), the ones that can
// run first and the rest folded, what the launch does to the tenant's quota, the volumes of
// the chosen region to attach, the catalog's images with whether the region can obtain each,
// and, after a refused launch, the error summary at the top in
// focus.
(() => {
  "use strict";
  const form = document.querySelector("[data-launch-form]");
  if (!form) return;
  const region = form.querySelector("[data-region]");
  const quota = form.querySelector("[data-quota]");
  const rows = [...form.querySelectorAll("tr[data-spec]")].sort((a, b) => a.dataset.order - b.dataset.order);
  const card = form.querySelector("#spec-card");
  const runnable = form.querySelector("[data-spec-table=runnable]");
  const folded = form.querySelector("[data-spec-table=folded]");
  const fold = form.querySelector("[data-spec-fold]");
  const fitLimit = Number(card.dataset.fitLimit);
  const number = (value) => Number.parseFloat(value || "0");
  const show = (value) => String(Math.round(value * 1000) / 1000);

  function selectedRow() {
    const checked = form.querySelector("input[name=spec]:checked");
    return checked ? checked.closest("tr") : null;
  }

  const summary = form.querySelector("[data-testid=error-summary]");
  const BADGES = {
    fits_now: "It starts provisioning at once.",
    queues: "It waits in the queue until a slice frees.",
  };

  function badge(status, label, detail) {
    const span = document.createElement("span");
    span.className = `badge badge-${status}`;
    span.textContent = label;
    if (detail) span.title = detail;
    return span;
  }

  function updateFits() {
    rows.forEach((row) => {
      const byRegion = JSON.parse(row.dataset.availability || "{}");
      const [status, label, detail, count] = byRegion[region.value] || ["no_hardware", "no hardware here", "", 0];
      row.querySelector("[data-role=fit]").replaceChildren(badge(status, label, detail));
      row.dataset.status = status;
      row.dataset.detail = detail;
      row.dataset.launchable = status in BADGES ? "1" : "0";
      row.querySelector("[data-role=count]").textContent =
        status in BADGES ? `${count}${count >= fitLimit ? "+" : ""} free` : "";
    });
    layout();
  }

  // What can run in the region first, the rest folded; each table with its group headings.
  function layout() {
    if (!runnable) return; // no specs offered at all
    [runnable, folded].forEach((table) => {
      const wanted = table === runnable ? "1" : "0";
      const parts = [];
      let group = null;
      rows.filter((row) => row.dataset.launchable === wanted).forEach((row) => {
        if (row.dataset.group !== group) {
          group = row.dataset.group;
          const heading = document.createElement("tr");
          heading.className = "spec-group";
          heading.dataset.groupRow = "";
          const cell = document.createElement("th");
          cell.colSpan = 6;
          cell.textContent = group;
          heading.append(cell);
          parts.push(heading);
        }
        parts.push(row);
      });
      table.tBodies[0].replaceChildren(...parts);
    });
    const canRun = rows.filter((row) => row.dataset.launchable === "1").length;
    runnable.hidden = canRun === 0;
    form.querySelector("[data-role=none-runnable]").hidden = canRun > 0;
    form.querySelector("[data-role=spec-counts]").textContent = `${canRun} can run here`;
    form.querySelector("[data-role=fold-count]").textContent = String(rows.length - canRun);
    fold.hidden = canRun === rows.length;
    const row = selectedRow();
    if (row && row.dataset.launchable !== "1") fold.open = true; // never hide the choice
  }

  function updateDisk() {
    const row = selectedRow();
    const disk = form.querySelector("#id_disk_gib");
    const note = form.querySelector("[data-role=spec-disk]");
    disk.placeholder = row ? row.dataset.disk : "";
    if (row) disk.min = row.dataset.disk;
    note.textContent = row ? `This spec comes with ${row.dataset.disk} GiB.` : "";
  }

  // Only the chosen region's volumes can be attached: the others are hidden and not sent.
  function updateVolumes() {
    const picker = form.querySelector("[data-volume-picker]");
    if (!picker) return;
    let here = 0;
    picker.querySelectorAll("tr[data-region]").forEach((row) => {
      const shown = row.dataset.region === region.value;
      row.hidden = !shown;
      row.querySelectorAll("input").forEach((input) => { input.disabled = !shown; });
      here += shown ? 1 : 0;
    });
    const table = picker.querySelector("table");
    if (table) table.hidden = here === 0;
    picker.querySelector("[data-role=no-volumes]").hidden = here > 0;
  }

  function meter(el, used, limit) {
    const pct = limit > 0 ? Math.min(100, (used * 100) / limit) : 100;
    el.style.width = `${pct}%`;
    el.parentElement.className = `meter${used > limit ? " bad" : pct >= 80 ? " warn" : ""}`;
  }

  function updateQuota() {
    const row = selectedRow();
    const gpuLimit = number(quota.dataset.gpuQuota);
    const instLimit = number(quota.dataset.maxInstances);
    const gpuAfter = number(quota.dataset.gpuUsed) + (row ? number(row.dataset.gpu) : 0);
    const instAfter = number(quota.dataset.instancesUsed) + (row ? 1 : 0);
    quota.querySelector("[data-role=gpu-after]").textContent = `${show(gpuAfter)} / ${show(gpuLimit)}`;
    quota.querySelector("[data-role=inst-after]").textContent = `${instAfter} / ${instLimit}`;
    meter(quota.querySelector("[data-role=gpu-meter]"), gpuAfter, gpuLimit);
    meter(quota.querySelector("[data-role=inst-meter]"), instAfter, instLimit);
    const note = quota.querySelector("[data-role=fit-note]");
    if (summary) {
      // the errors at the top still stand: nothing here may say this launch goes ahead
      note.replaceChildren(
        badge("over_quota", "not launched", ""),
        ` Fix the ${summary.dataset.errors === "1" ? "problem" : "problems"} at the top of the form first.`,
      );
    } else if (!row) {
      note.textContent = "Choose a spec.";
    } else if (row.dataset.launchable !== "1") {
      note.replaceChildren(badge(row.dataset.status, "cannot launch", ""), ` ${row.dataset.detail}`);
    } else if (gpuAfter > gpuLimit || instAfter > instLimit) {
      note.replaceChildren(badge("over_quota", "over quota", ""), " This launch would be refused.");
    } else {
      const label = row.dataset.status === "fits_now" ? "fits now" : "queues";
      note.replaceChildren(badge(row.dataset.status, label, ""), ` ${BADGES[row.dataset.status]}`);
    }
  }

  // Each catalog image in the chosen region: where it comes from (or why it cannot), grayed
  // out where no host can obtain it, and the host that holds it where the chosen spec would
  // go there ("on host-b: cached").
  const imageOptions = [...form.querySelectorAll("[data-image-picker] [data-image]")];

  function updateImages() {
    const code = region.value;
    const spec = form.querySelector("input[name=spec]:checked");
    let checkedGone = false;
    imageOptions.forEach((option) => {
      const here = JSON.parse(option.dataset.availability)[code];
      if (!here) return;
      const input = option.querySelector("input");
      const status = option.querySelector("[data-role=image-status]");
      status.className = `badge badge-image-${here.status}`;
      status.textContent = here.label;
      option.querySelector("[data-role=image-size]").textContent = here.size;
      option.querySelector("[data-role=image-detail]").textContent = here.detail;
      const host = spec ? here.cached[spec.value] : "";
      const cached = option.querySelector("[data-role=image-cached]");
      cached.textContent = host ? `on ${host}: cached` : "";
      cached.hidden = !host;
      input.disabled = !here.launchable;
      if (input.disabled && input.checked) {
        input.checked = false;
        checkedGone = true;
      }
    });
    if (checkedGone || !form.querySelector("input[name=image]:checked")) {
      const first = imageOptions.map((o) => o.querySelector("input")).find((i) => !i.disabled);
      if (first) first.checked = true;
    }
  }

  rows.forEach((row) => row.addEventListener("click", (event) => {
    if (event.target.tagName !== "INPUT") row.querySelector("input").click();
  }));
  form.addEventListener("change", () => {
    updateFits();
    updateQuota();
    updateDisk();
    updateVolumes();
    updateImages();
  });
  updateFits();
  updateQuota();
  updateDisk();
  updateVolumes();
  updateImages();
  if (summary) {
    summary.scrollIntoView({ block: "start" });
    const first = summary.querySelector("[data-error-link]");
    if (first) first.focus();
  }
})();
