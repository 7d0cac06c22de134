package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

const (
	serviceCIDR = "10.0.0.0/24"
	serviceIP   = "10.0.0.1" // first address of serviceCIDR: the "kubernetes" Service
)

// readyInfo is written to <dir>/ready.json once the apiserver answers /readyz.
type readyInfo struct {
	Server          string `json:"server"`
	AdminKubeconfig string `json:"admin_kubeconfig"`
	CAFile          string `json:"ca_file"`
	PID             int    `json:"pid"`
}

// component is one control-plane process started by re-executing this binary.
type component struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process has exited; err says how
	err    error
}

func runUp(args []string) int {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	dir := fs.String("dir", "", "working directory for certificates, data, logs and kubeconfigs (required)")
	port := fs.Int("port", 0, "apiserver secure port on 127.0.0.1 (0 picks a free one)")
	verbosity := fs.Int("v", 1, "log verbosity passed to the components")
	_ = fs.Parse(args)
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "up: --dir is required")
		return 2
	}
	if err := up(*dir, *port, *verbosity); err != nil {
		fmt.Fprintf(os.Stderr, "up: %v\n", err)
		return 1
	}
	return 0
}

func up(dir string, port, verbosity int) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	logs := filepath.Join(dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(dir, "ready.json"))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = exitWithParent(ctx)

	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	if port == 0 {
		port = ports[0]
	}
	server := "https://127.0.0.1:" + strconv.Itoa(port)

	files, err := writeCredentials(dir, server)
	if err != nil {
		return fmt.Errorf("credentials: %w", err)
	}

	etcd, etcdURL, err := startEtcd(filepath.Join(dir, "etcd"), ports[1], ports[2], logs)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()
	fmt.Printf("etcd serving on %s\n", etcdURL)

	self, err := os.Executable()
	if err != nil {
		return err
	}
	v := "--v=" + strconv.Itoa(verbosity)
	var running []*component
	defer func() { stopAll(running) }()

	apiserver, err := start(self, logs, "kube-apiserver",
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--cert-dir="+filepath.Join(dir, "apiserver"),
		"--tls-cert-file="+files["apiserver.crt"],
		"--tls-private-key-file="+files["apiserver.key"],
		"--client-ca-file="+files["ca.crt"],
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--api-audiences=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+files["sa.pub"],
		"--service-account-signing-key-file="+files["sa.key"],
		"--authorization-mode=Node,RBAC",
		"--service-cluster-ip-range="+serviceCIDR,
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--endpoint-reconciler-type=none",
		v,
	)
	if err != nil {
		return err
	}
	running = append(running, apiserver)
	if err := waitReady(ctx, server, files, apiserver); err != nil {
		return err
	}
	fmt.Printf("kube-apiserver ready at %s\n", server)

	controllers := []string{
		"garbage-collector-controller", "namespace-controller", "serviceaccount-controller",
		"serviceaccount-token-controller", "root-ca-certificate-publisher-controller",
		"pod-garbage-collector-controller", "node-lifecycle-controller",
		"taint-eviction-controller", "job-controller", "replicaset-controller",
		"clusterrole-aggregation-controller", "ttl-after-finished-controller",
		// Services: EndpointSlices (what the test cluster's DNS serves) and the legacy
		// Endpoints some clients still read.
		"endpointslice-controller", "endpoints-controller",
		// PodDisruptionBudget status, which the eviction API checks.
		"disruption-controller",
		// PersistentVolumeClaims: binding to the PVs the test cluster's provisioner creates,
		// and the protection finalizers the admission plugins add.
		"persistentvolume-binder-controller", "persistentvolumeclaim-protection-controller",
		"persistentvolume-protection-controller",
	}
	cm, err := start(self, logs, "kube-controller-manager",
		"--kubeconfig="+files["controller-manager.kubeconfig"],
		"--authentication-kubeconfig="+files["controller-manager.kubeconfig"],
		"--authorization-kubeconfig="+files["controller-manager.kubeconfig"],
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--controllers="+joinComma(controllers),
		"--service-account-private-key-file="+files["sa.key"],
		"--root-ca-file="+files["ca.crt"],
		"--use-service-account-credentials=true",
		"--leader-elect=false",
		"--profiling=false",
		// The process kubelet renews its Lease every few seconds; a short grace period
		// still tolerates a busy test machine.
		"--node-monitor-period=2s",
		"--node-monitor-grace-period=40s",
		v,
	)
	if err != nil {
		return err
	}
	running = append(running, cm)

	sched, err := start(self, logs, "kube-scheduler",
		"--kubeconfig="+files["scheduler.kubeconfig"],
		"--authentication-kubeconfig="+files["scheduler.kubeconfig"],
		"--authorization-kubeconfig="+files["scheduler.kubeconfig"],
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--leader-elect=false",
		"--profiling=false",
		v,
	)
	if err != nil {
		return err
	}
	running = append(running, sched)

	info := readyInfo{Server: server, AdminKubeconfig: files["admin.kubeconfig"],
		CAFile: files["ca.crt"], PID: os.Getpid()}
	data, _ := json.MarshalIndent(info, "", "  ")
	tmp := filepath.Join(dir, "ready.json.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "ready.json")); err != nil {
		return err
	}
	fmt.Printf("control plane ready; admin kubeconfig: %s\n", files["admin.kubeconfig"])

	// Run until told to stop, or until a component dies (a broken cluster must fail loudly).
	select {
	case <-ctx.Done():
		fmt.Println("stopping control plane")
		return nil
	case c := <-anyExited(running):
		return c.err
	}
}

// writeCredentials creates the CA, the serving certificate, the service-account keys and
// one kubeconfig per client identity that RBAC's bootstrap bindings recognise.
func writeCredentials(dir, server string) (map[string]string, error) {
	ca, err := newAuthority()
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	write := func(name string, data []byte, mode os.FileMode) error {
		files[name] = filepath.Join(dir, name)
		return os.WriteFile(files[name], data, mode)
	}
	if err := write("ca.crt", ca.pem, 0o644); err != nil {
		return nil, err
	}
	cert, key, err := ca.issue("kube-apiserver", nil, true)
	if err != nil {
		return nil, err
	}
	if err := write("apiserver.crt", cert, 0o644); err != nil {
		return nil, err
	}
	if err := write("apiserver.key", key, 0o600); err != nil {
		return nil, err
	}
	if files["sa.key"], files["sa.pub"], err = writeServiceAccountKeys(dir); err != nil {
		return nil, err
	}
	clients := []struct{ file, cn, org string }{
		{"admin.kubeconfig", "elastic-step-admin", "system:masters"},
		{"controller-manager.kubeconfig", "system:kube-controller-manager", ""},
		{"scheduler.kubeconfig", "system:kube-scheduler", ""},
	}
	for _, c := range clients {
		var orgs []string
		if c.org != "" {
			orgs = []string{c.org}
		}
		cert, key, err := ca.issue(c.cn, orgs, false)
		if err != nil {
			return nil, err
		}
		files[c.file] = filepath.Join(dir, c.file)
		if err := writeKubeconfig(files[c.file], server, c.cn, ca.pem, cert, key); err != nil {
			return nil, err
		}
		// Keep the admin's PEM files too: plain HTTP clients (and the readiness probe) use them.
		if c.file == "admin.kubeconfig" {
			if err := write("admin.crt", cert, 0o644); err != nil {
				return nil, err
			}
			if err := write("admin.key", key, 0o600); err != nil {
				return nil, err
			}
		}
	}
	return files, nil
}

func startEtcd(dataDir string, clientPort, peerPort int, logs string) (*embed.Etcd, string, error) {
	// A fresh data directory per run: a test cluster never reuses state.
	if err := os.RemoveAll(dataDir); err != nil {
		return nil, "", err
	}
	cfg := embed.NewConfig()
	cfg.Name = "elastic-step-test"
	cfg.Dir = dataDir
	clientURL := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(clientPort)}
	peerURL := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(peerPort)}
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{filepath.Join(logs, "etcd.log")}
	// Tests do not need durability; skipping fsync keeps etcd fast on a loaded machine.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, clientURL.String(), nil
	case err := <-e.Err():
		e.Close()
		return nil, "", err
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", errors.New("etcd did not become ready in 60s")
	}
}

// start re-executes this binary as one component, logging to logs/<name>.log.
func start(self, logs, name string, args ...string) (*component, error) {
	logFile, err := os.Create(filepath.Join(logs, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, append([]string{name}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// If this process is killed outright, the kernel takes the components down with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &component{name: name, cmd: cmd, exited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		logFile.Close()
		c.err = fmt.Errorf("%s exited: %v (see %s)", name, err, logFile.Name())
		close(c.exited)
	}()
	fmt.Printf("started %s (pid %d)\n", name, cmd.Process.Pid)
	return c, nil
}

// stopAll stops components in reverse start order: SIGTERM, then SIGKILL after 10s.
func stopAll(components []*component) {
	for i := len(components) - 1; i >= 0; i-- {
		c := components[i]
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	}
}

func anyExited(components []*component) <-chan *component {
	out := make(chan *component, len(components))
	for _, c := range components {
		go func(c *component) {
			<-c.exited
			out <- c
		}(c)
	}
	return out
}

func waitReady(ctx context.Context, server string, files map[string]string, apiserver *component) error {
	pair, err := tls.LoadX509KeyPair(files["admin.crt"], files["admin.key"])
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(files["ca.crt"])
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}},
	}}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		resp, err := client.Get(server + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-apiserver.exited:
			return apiserver.err
		case <-time.After(250 * time.Millisecond):
		}
	}
	return errors.New("kube-apiserver not ready after 3m")
}

// exitWithParent cancels ctx when the parent (the test run) dies without stopping us.
func exitWithParent(ctx context.Context) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	parent := os.Getppid()
	go func() {
		for ctx.Err() == nil {
			if os.Getppid() != parent {
				cancel()
				return
			}
			time.Sleep(time.Second)
		}
	}()
	return ctx
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func joinComma(items []string) string {
	out := ""
	for i, s := range items {
		if i > 0 {
			out += ","
		}
		out += s
	}
	return out
}
