//! The web UI in a real headless Chromium (Debian's `chromium` and `chromium-driver`, which
//! `scripts/setup ui` installs) against the real `caravan` binary: the pages load without a
//! console message, a job submitted through the CLI appears, its alloc's log lines arrive
//! while the page is open, and a stop made in the page stops the job.
//!
//! The browser is driven over WebDriver's HTTP protocol with the tests' own HTTP helper: a
//! handful of JSON calls, no client library.

use crate::support::{AgentProcess, eventually_async, http, within};
use caravan_test_artifacts::SLEEPER;
use serde_json::{Value, json};
use std::net::SocketAddr;

const TOKEN: &str = "ui-test-token";

/// A task name that is markup: the runner reports it back in its states and log lines, and
/// the page must show it as text.
const MARKUP_TASK: &str = "<img id='injected' src='/x' onerror='document.title=1'>web";

/// A chromedriver process and one browser session in it, both ended when dropped.
struct Browser {
    driver: std::process::Child,
    addr: SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Browser {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let driver =
            crate::etcd::dies_with_its_parent(&mut std::process::Command::new("chromedriver"))
                .arg(format!("--port={port}"))
                // The pages' local times read as UTC's, whatever this machine's zone.
                .env("TZ", "UTC")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap_or_else(|error| {
                    panic!("chromedriver cannot start ({error}); `scripts/setup ui` installs it")
                });
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        eventually_async("chromedriver ready", || async {
            tokio::net::TcpStream::connect(addr).await.is_ok()
        })
        .await;
        let profile = tempfile::tempdir().unwrap();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--window-size=1280,1250",
                         format!("--user-data-dir={}", profile.path().display())],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let (status, answer) = http(
            addr,
            "POST",
            "/session",
            Some(&capabilities.to_string()),
            None,
        )
        .await;
        assert_eq!(status, 200, "no browser session: {answer}");
        let session = answer["value"]["sessionId"].as_str().unwrap().to_string();
        Browser {
            driver,
            addr,
            session,
            _profile: profile,
        }
    }

    /// One WebDriver command of this session; its `value`.
    async fn command(&self, method: &str, path: &str, body: Value) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let body = (method == "POST").then(|| body.to_string());
        let (status, answer) = http(self.addr, method, &path, body.as_deref(), None).await;
        assert_eq!(status, 200, "{method} {path}: {answer}");
        answer["value"].clone()
    }

    async fn open(&self, url: &str) {
        self.command("POST", "/url", json!({ "url": url })).await;
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    async fn run(&self, script: &str) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            json!({ "script": script, "args": [] }),
        )
        .await
    }

    /// The text of the first element matching `selector`, or "" while there is none.
    async fn text(&self, selector: &str) -> String {
        let script = format!(
            "const e = document.querySelector({selector:?}); return e ? e.textContent : '';"
        );
        self.run(&script).await.as_str().unwrap_or("").to_string()
    }

    /// The first element matching `selector`, once there is one.
    async fn element(&self, selector: &str) -> String {
        let find = json!({ "using": "css selector", "value": selector }).to_string();
        let path = format!("/session/{}/element", self.session);
        within(&format!("an element {selector}"), async {
            loop {
                let (status, answer) = http(self.addr, "POST", &path, Some(&find), None).await;
                // An element reference is an object with one key, whatever its name.
                let id = answer["value"]
                    .as_object()
                    .and_then(|o| o.values().next())
                    .and_then(Value::as_str);
                if let (200, Some(id)) = (status, id) {
                    return id.to_string();
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
        .await
    }

    async fn click(&self, selector: &str) {
        let element = self.element(selector).await;
        self.command("POST", &format!("/element/{element}/click"), json!({}))
            .await;
    }

    async fn type_into(&self, selector: &str, text: &str) {
        let element = self.element(selector).await;
        self.command(
            "POST",
            &format!("/element/{element}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    /// Waits until the text of `selector` satisfies `done`, then returns it.
    async fn wait_for_text(&self, what: &str, selector: &str, done: impl Fn(&str) -> bool) {
        eventually_async(what, || async { done(&self.text(selector).await) }).await;
    }

    /// What the page wrote to its console since the last call.
    async fn console(&self) -> Vec<Value> {
        let entries = self
            .command("POST", "/se/log", json!({ "type": "browser" }))
            .await;
        entries.as_array().cloned().unwrap_or_default()
    }

    /// A PNG of the window.
    async fn screenshot(&self) -> Vec<u8> {
        let encoded = self.command("GET", "/screenshot", json!(null)).await;
        decode_base64(encoded.as_str().unwrap())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The session first: Chromium would outlive a killed chromedriver.
        use std::io::{Read, Write};
        let timeout = std::time::Duration::from_secs(10);
        if let Ok(mut stream) = std::net::TcpStream::connect_timeout(&self.addr, timeout) {
            let _ = stream.set_read_timeout(Some(timeout));
            let _ = write!(
                stream,
                "DELETE /session/{} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\r\n",
                self.session, self.addr
            );
            let _ = stream.read(&mut [0u8; 4096]);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Standard base64 to bytes: the one decode a screenshot needs, without a dependency.
fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let digits: Vec<u8> = text
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
        .map(value)
        .collect();
    let mut bytes = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let bits = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, d)| acc | (u32::from(*d) << (18 - 6 * i)));
        bytes.extend_from_slice(&bits.to_be_bytes()[1..chunk.len()]);
    }
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_ui_shows_a_cli_job_follows_its_log_and_stops_it() {
    // Sampled five times a second, so that the plots fill while the test looks.
    let config = "[telemetry]\ncollection_interval = \"200ms\"\n";
    let agent = AgentProcess::start_configured(&["--dev", "--acl-token", TOKEN], config);
    let browser = Browser::start().await;
    let screenshots = checked(&agent, &browser, the_web_ui_steps(&agent, &browser)).await;
    // `CARAVAN_UI_SCREENSHOTS=docs` refreshes the pictures in the docs.
    if let Ok(dir) = std::env::var("CARAVAN_UI_SCREENSHOTS") {
        for (name, png) in screenshots {
            std::fs::write(std::path::Path::new(&dir).join(name), png).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_read_token_the_web_ui_shows_the_job_and_offers_no_action() {
    let agent = AgentProcess::start_configured(&["--dev", "--acl-enabled"], "");
    let browser = Browser::start().await;
    checked(&agent, &browser, read_token_steps(&agent, &browser)).await;
}

/// Runs `steps`, then fails the test if they failed or the page wrote to its console,
/// printing the page's text, its console and the agent's log first.
async fn checked<T>(
    agent: &AgentProcess,
    browser: &Browser,
    steps: impl std::future::Future<Output = Result<T, String>>,
) -> T {
    // A step that times out panics: caught, so the page and logs below are shown first.
    let steps = std::panic::AssertUnwindSafe(steps);
    let result = match futures_util::FutureExt::catch_unwind(steps).await {
        Ok(result) => result,
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a step panicked".into())),
    };
    // Chromium's DEBUG advice is not the page's doing; anything louder is.
    let console: Vec<Value> = browser
        .console()
        .await
        .into_iter()
        .filter(|entry| entry["level"] != "DEBUG")
        .collect();
    if result.is_err() || !console.is_empty() {
        println!(
            "--- the page's text\n{}\n--- its console\n{console:#?}\n--- the agent's log",
            browser.text("body").await
        );
        for line in agent.unread_lines() {
            println!("{line}");
        }
    }
    let value = result.unwrap();
    assert!(console.is_empty(), "the page wrote to its console");
    value
}

/// An operator with a read token: the page asks for it once (kept for the tab), shows the
/// job, and every action is disabled, saying the role it needs.
async fn read_token_steps(agent: &AgentProcess, browser: &Browser) -> Result<(), String> {
    let management = crate::support::acl_bootstrap(agent.socket_addr()).await;
    let (read, _) =
        crate::support::acl_token(agent.socket_addr(), &management, "dashboard", "read", None)
            .await;
    let dir = tempfile::tempdir().unwrap();
    let job_file = crate::support::service_job_file(dir.path(), "watched", 1, SLEEPER);
    let run = agent.caravan(&[
        "job",
        "run",
        "--token",
        &management,
        job_file.to_str().unwrap(),
    ]);
    if !run.status.success() {
        return Err("caravan job run failed".into());
    }

    // The token goes in before the page asks for anything (set from another page of the
    // agent, as the tab keeps it): a page with no token would be refused its reads, and
    // the browser would say so in its console.
    browser
        .open(&format!("{}/ui/favicon.svg", agent.addr))
        .await;
    browser
        .run(&format!(
            "sessionStorage.setItem('caravan-token', {read:?}); return true;"
        ))
        .await;
    browser.console().await;
    browser
        .open(&format!("{}/ui#/job/watched", agent.addr))
        .await;
    browser
        .wait_for_text("the job page with its alloc", "main", |t| {
            t.contains("Job watched") && t.contains("running (1)")
        })
        .await;
    if browser
        .run("return document.getElementById('token-form').hidden;")
        .await
        != false
    {
        return Err("the token box is hidden on an agent with ACLs on".into());
    }
    let states = || async {
        browser
            .run("return [...document.querySelectorAll('button[data-needs]')].map(b => [b.textContent, b.disabled, b.title]);")
            .await
    };
    eventually_async("every action disabled", || async {
        let buttons = states().await;
        let buttons = buttons.as_array().cloned().unwrap_or_default();
        !buttons.is_empty() && buttons.iter().all(|b| b[1] == true)
    })
    .await;
    let buttons = states().await;
    if !buttons
        .to_string()
        .contains("needs a token with role submit or above")
    {
        return Err(format!(
            "the disabled actions do not say what they need: {buttons}"
        ));
    }
    Ok(())
}

/// How many of `selector`'s elements the page has.
async fn count(browser: &Browser, selector: &str) -> u64 {
    let script = format!("return document.querySelectorAll({selector:?}).length;");
    browser.run(&script).await.as_u64().unwrap_or(0)
}

/// The steps, returning the screenshots of the alloc page (taken while its log runs) and of
/// the topology, each with the file name the docs know it by.
async fn the_web_ui_steps(
    agent: &AgentProcess,
    browser: &Browser,
) -> Result<Vec<(&'static str, Vec<u8>)>, String> {
    browser.open(&format!("{}/", agent.addr)).await;
    browser
        .wait_for_text("the jobs page", "main h1", |t| t == "Jobs")
        .await;
    let path = browser.run("return location.pathname;").await;
    if path != "/ui" {
        return Err(format!("/ redirected to {path}, not /ui"));
    }

    // A job from the CLI appears without a reload.
    let dir = tempfile::tempdir().unwrap();
    let job_file = dir.path().join("sleepy.toml");
    std::fs::write(
        &job_file,
        format!(
            "[job]\nid = \"sleepy\"\ntype = \"service\"\ncount = 1\nrunner = {SLEEPER:?}\n\
             [[job.tasks]]\nname = {MARKUP_TASK:?}\nconfig = {{ log_every = \"200ms\" }}\n"
        ),
    )
    .unwrap();
    let run = agent.caravan(&["job", "run", "--token", TOKEN, job_file.to_str().unwrap()]);
    if !run.status.success() {
        return Err("caravan job run failed".into());
    }
    browser
        .wait_for_text("the job in the jobs table", "main table", |t| {
            t.contains("sleepy") && t.contains("1 running")
        })
        .await;

    // The token, typed as an operator would, is what the actions below send.
    browser.type_into("#token", TOKEN).await;
    browser.click("a[href='#/job/sleepy']").await;
    browser
        .wait_for_text("the job's running alloc", "main", |t| {
            t.contains("running (1)")
        })
        .await;
    // The job page shows each task's config, its name as text.
    browser
        .wait_for_text("the task's config on the job page", "#job-tasks", |t| {
            t.contains(MARKUP_TASK) && t.contains("log_every = 200ms")
        })
        .await;
    // Its allocs over time, one line per status, from the samples the agent took.
    eventually_async("the job's allocs plotted", || async {
        count(browser, "#chart-job polyline").await == 4
    })
    .await;
    let legend = browser.text("#chart-job .legend").await;
    if !legend.contains("placed 1") || !legend.contains("running 1") {
        return Err(format!("the job's chart says {legend:?}"));
    }
    browser.click("main a.id").await;
    browser
        .wait_for_text("the alloc page", "main dl", |t| {
            t.contains("Client statusrunning") && t.contains("CPU used") && t.contains(" ago)")
                // Times as the CLI prints them: local, to the second, with the offset.
                && t.contains(" +00:00 (")
        })
        .await;
    // What a running alloc allows is offered, and nothing else.
    let offered = browser
        .run("return [...document.querySelectorAll('main button[data-needs]')].filter(b => !b.hidden).map(b => b.textContent).join(',');")
        .await;
    if offered != "Restart,Send,Stop alloc" {
        return Err(format!("a running alloc offers {offered}"));
    }
    // The sleeper reaches no files: it has no alloc dir, and the page shows none.
    if browser.text("main dl").await.contains("Alloc dir") {
        return Err("the alloc page shows an alloc dir for a runner that has none".into());
    }

    // Lines written after the page opened arrive in it.
    let log_lines = || async { browser.text("#alloc-log").await.lines().count() };
    browser
        .wait_for_text("the first log lines", "#alloc-log", |t| {
            t.contains("still running")
        })
        .await;
    let seen = log_lines().await;
    eventually_async("a log line written after the page opened", || async {
        log_lines().await > seen + 2
    })
    .await;
    // What the runner reported came back as text, not as an element.
    let injected = browser
        .run("return document.getElementById('injected') === null && document.title !== '1';")
        .await;
    if injected != true {
        return Err("a task name was taken as markup".into());
    }
    let tasks = browser.text("main").await;
    if !tasks.contains(&format!("Task {MARKUP_TASK}: running")) {
        return Err(format!("the task's name is not shown as written: {tasks}"));
    }
    // Its CPU and memory, as the agent sampled them.
    eventually_async("the alloc's CPU and memory plotted", || async {
        count(browser, "#chart-cpu polyline").await == 1
            && count(browser, "#chart-memory polyline").await == 1
    })
    .await;
    let memory = browser.text("#chart-memory .legend").await;
    if !memory.contains("KiB") && !memory.contains("MiB") {
        return Err(format!("the memory chart says {memory:?}"));
    }
    let alloc_screenshot = browser.screenshot().await;

    // The topology: the node, the memory its allocs reserve, and the running alloc.
    browser.click("nav a[href='#/topology']").await;
    browser
        .wait_for_text("the node in the topology", ".node-card", |t| {
            t.contains("local") && t.contains("1 alloc") && t.contains("reserved")
        })
        .await;
    if count(browser, ".node-card a.square.status-bg-running").await != 1 {
        return Err("the topology does not draw the running alloc".into());
    }
    let topology_screenshot = browser.screenshot().await;
    browser.run("history.back(); return null;").await;
    browser
        .wait_for_text("the alloc page again", "main h1", |t| {
            t.starts_with("Allocation")
        })
        .await;

    // A stop from the page stops the job: the second click confirms.
    browser.click("main dd a[href='#/job/sleepy']").await;
    browser
        .wait_for_text("the job page", "main h1", |t| t == "Job sleepy")
        .await;
    browser.click("button.danger").await;
    browser
        .wait_for_text("the stop's confirmation", "button.danger", |t| {
            t == "Yes, stop the job"
        })
        .await;
    browser.click("button.danger").await;
    browser
        .wait_for_text("the page saying it stopped", "#notice", |t| {
            t == "Stopped sleepy."
        })
        .await;
    let (_, job) = http(agent.socket_addr(), "GET", "/v1/job/sleepy", None, None).await;
    if job["status"] != "stopped" {
        return Err(format!("the job is not stopped: {job}"));
    }
    browser
        .wait_for_text("the alloc complete in the page", "main", |t| {
            t.contains("complete (1)")
        })
        .await;
    Ok(vec![
        ("ui-alloc.png", alloc_screenshot),
        ("ui-topology.png", topology_screenshot),
    ])
}
