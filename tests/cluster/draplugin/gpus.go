// The node's GPUs and the driver's libraries, found as the device plugin
// (tests/cluster/deviceplugin) finds them: keep the two in step.
package main

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// The control and UVM nodes a CUDA program opens, given to every claim where they exist.
var controlNodes = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}

// The driver libraries a CUDA and NVML program loads, by name prefix, as the toolkit's
// "compute,utility" capabilities mount them.
var driverLibs = []string{"libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
	"libnvidia-nvvm.so", "libnvidia-gpucomp.so", "libcudadebugger.so"}

type gpu struct {
	index   int
	uuid    string
	product string
}

type mount struct{ host, container string }

// findGPUs lists each /dev/nvidiaN of dev as GPU N, with the uuid and model the driver gives
// under procDir (by device minor) where it does, else uuid GPU-<node>-N and product.
func findGPUs(dev, procDir, node, product string) ([]gpu, error) {
	entries, err := os.ReadDir(dev)
	if err != nil {
		return nil, err
	}
	described := describedGPUs(procDir)
	re := regexp.MustCompile(`^nvidia([0-9]+)$`)
	var out []gpu
	for _, e := range entries {
		m := re.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		g, ok := described[n]
		if !ok {
			g = gpu{uuid: fmt.Sprintf("GPU-%s-%d", node, n), product: product}
		}
		g.index = n
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].index < out[j].index })
	return out, nil
}

// describedGPUs reads the driver's information file of each GPU (Model, GPU UUID, Device
// Minor), by minor; empty where there is none.
func describedGPUs(procDir string) map[int]gpu {
	out := map[int]gpu{}
	files, _ := filepath.Glob(filepath.Join(procDir, "*", "information"))
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		fields := map[string]string{}
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok {
				fields[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
		f.Close()
		minor, err := strconv.Atoi(fields["Device Minor"])
		if err != nil || fields["GPU UUID"] == "" {
			continue
		}
		out[minor] = gpu{uuid: fields["GPU UUID"], product: fields["Model"]}
	}
	return out
}

// libMounts binds each driver library of driverLibs into the container's library directory
// under its soname, read-only.
func libMounts(dir string) ([]mount, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []mount
	for _, e := range entries {
		name := e.Name()
		wanted := false
		for _, l := range driverLibs {
			if strings.HasPrefix(name, l+".") {
				wanted = true
			}
		}
		if !wanted {
			continue
		}
		host, err := filepath.EvalSymlinks(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		f, err := elf.Open(host)
		if err != nil {
			continue
		}
		sonames, err := f.DynString(elf.DT_SONAME)
		f.Close()
		if err != nil || len(sonames) == 0 || seen[sonames[0]] {
			continue
		}
		seen[sonames[0]] = true
		out = append(out, mount{host: host, container: "/usr/lib/x86_64-linux-gnu/" + sonames[0]})
	}
	if !seen["libcuda.so.1"] || !seen["libnvidia-ml.so.1"] {
		return nil, fmt.Errorf("%s holds no libcuda.so.1 and libnvidia-ml.so.1", dir)
	}
	return out, nil
}
